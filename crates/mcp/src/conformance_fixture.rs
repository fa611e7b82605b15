//! The tool the MCP conformance suite's `json-schema-2020-12` scenario
//! looks for by name (`json_schema_2020_12_tool`, with an `address` in
//! `$defs` and no extra properties), to check that a server's tool listing
//! keeps `$schema`, `$defs` and `additionalProperties`. Only test builds
//! have it (feature `conformance-fixture`, which `test-hooks` enables);
//! every real tool's schema goes through the same listing.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::MicroagentServer;

/// The fixture's input.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FixtureParams {
    /// A name.
    pub name: String,
    /// An address.
    pub address: Option<FixtureAddress>,
}

/// A postal address.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "address")]
#[serde(deny_unknown_fields)]
pub struct FixtureAddress {
    /// The street.
    pub street: String,
    /// The city.
    pub city: String,
}

#[tool_router(router = conformance_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Test fixture of the MCP conformance suite: echoes its input.
    #[tool]
    async fn json_schema_2020_12_tool(&self, Parameters(p): Parameters<FixtureParams>) -> String {
        format!("{p:?}")
    }
}
