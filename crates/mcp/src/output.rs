//! What a successful tool call returns: the value as `structuredContent`
//! (it matches the tool's output schema) plus a short text rendering for
//! clients and models that read only `content`.

use rmcp::handler::server::tool::IntoCallToolResult;
use std::sync::Arc;

use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, JsonObject};
use serde::Serialize;

/// A human-readable rendering of a tool's output.
pub trait Render {
    /// A few lines that say what happened.
    fn render(&self) -> String;

    /// Content beside the text (files a command left: images, embedded
    /// resources, links).
    fn blocks(&self) -> Vec<ContentBlock> {
        Vec::new()
    }
}

/// A tool's successful output.
#[derive(Debug)]
pub struct Out<T>(pub T);

/// Shorthand for what every tool returns.
pub type ToolResult<T> = Result<Out<T>, crate::ToolError>;

impl<T: Serialize + Render> Out<T> {
    /// The tool result: structured content and its rendering.
    pub fn to_result(&self) -> Result<CallToolResult, rmcp::ErrorData> {
        let value = serde_json::to_value(&self.0).map_err(|e| {
            rmcp::ErrorData::internal_error(format!("cannot serialize the result: {e}"), None)
        })?;
        let mut content = vec![ContentBlock::text(self.0.render())];
        content.extend(self.0.blocks());
        let mut result = CallToolResult::success(content);
        result.structured_content = Some(value);
        Ok(result)
    }
}

impl<T: Serialize + Render> IntoCallToolResult for Out<T> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        Ok(self.to_result()?.into())
    }
}

/// The output schema of a tool that returns `T` (its serialized form).
pub fn schema<T: schemars::JsonSchema + 'static>() -> Arc<JsonObject> {
    rmcp::handler::server::tool::schema_for_output::<T>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Greeting {
        who: String,
    }

    impl Render for Greeting {
        fn render(&self) -> String {
            format!("hello {}", self.who)
        }
    }

    #[test]
    fn results_have_structure_and_text() {
        let result = Out(Greeting { who: "dev".into() }).to_result().unwrap();
        assert_eq!(result.is_error, Some(false));
        assert_eq!(result.structured_content.unwrap()["who"], "dev");
        assert_eq!(result.content[0].as_text().unwrap().text, "hello dev");
    }

    #[test]
    fn byte_counts_read_well() {}
}
