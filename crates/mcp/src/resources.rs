//! MCP resources: the workspaces as documents a client reads without a
//! tool call. `microagent://workspaces` is the inventory (what
//! `workspace_list` returns), `microagent://workspace/{name}` one
//! workspace (`workspace_inspect`), `.../logs` its console's last lines,
//! and the template `.../files/{path}` reads a guest file, at most
//! [`MAX_READ_LENGTH`] bytes of it; a client may subscribe to a file's
//! resource to hear when it changes ([`crate::subscriptions`]).

use base64::Engine;
use rmcp::model::{
    ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate, SubscriptionFilter,
};
use rmcp::service::SubscriptionContext;
use rmcp::ErrorData;
use serde_json::json;
use workspace::ListFilter;

use crate::error::ToolError;
use crate::schema::files::MAX_READ_LENGTH;
use crate::schema::lifecycle::{ListResult, DEFAULT_LOG_LINES};
use crate::server::MicroagentServer;
use crate::subscriptions::{Subscriptions, UpdateSink, MAX_REQUESTED, MAX_SUBSCRIPTIONS};

pub use crate::uris::WORKSPACES_URI;
use crate::uris::WORKSPACE_PREFIX;

const JSON: &str = "application/json";

/// What a resource URI names.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    Inventory,
    Workspace(String),
    Logs(String),
    File { name: String, path: String },
}

/// The target of `uri`, or `None` when it is not one of ours.
fn parse(uri: &str) -> Option<Target> {
    if uri == WORKSPACES_URI {
        return Some(Target::Inventory);
    }
    let rest = uri.strip_prefix(WORKSPACE_PREFIX)?;
    let (name, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if name.is_empty() {
        return None;
    }
    let name = name.to_owned();
    match tail {
        "" => Some(Target::Workspace(name)),
        "logs" => Some(Target::Logs(name)),
        _ => {
            // `{path}` expands with its slashes escaped (RFC 6570), or a
            // client writes them as they are: both name the same file.
            let path = percent_decode(tail.strip_prefix("files/")?)?;
            let path = format!("/{}", path.trim_start_matches('/'));
            Some(Target::File { name, path })
        }
    }
}

/// `%XX` escapes undone; `None` for a malformed one or a result that is
/// not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A tool error as a JSON-RPC error: an unknown workspace or file is
/// "resource not found"; the stable code goes in `data`.
fn to_error(uri: &str, e: ToolError) -> ErrorData {
    let code = e.code();
    let data = Some(json!({"uri": uri, "code": code.as_str()}));
    match code {
        workspace::ErrorCode::NotFound => ErrorData::resource_not_found(e.to_string(), data),
        workspace::ErrorCode::InvalidInput => ErrorData::invalid_params(e.to_string(), data),
        _ => ErrorData::internal_error(e.to_string(), data),
    }
}

impl MicroagentServer {
    /// The templates a client can fill in.
    pub(crate) fn resource_templates() -> ListResourceTemplatesResult {
        templates()
    }
}

fn templates() -> ListResourceTemplatesResult {
    ListResourceTemplatesResult::with_all_items(vec![
        ResourceTemplate::new("microagent://workspace/{name}", "workspace")
            .with_description("One workspace: spec, state, VMM, ages, disk use (workspace_inspect)")
            .with_mime_type(JSON),
        ResourceTemplate::new("microagent://workspace/{name}/logs", "workspace-logs")
            .with_description("The last lines of a workspace's serial console")
            .with_mime_type("text/plain"),
        ResourceTemplate::new("microagent://workspace/{name}/files/{path}", "workspace-file")
            .with_description(format!(
                "A file in a running workspace (path absolute, its slashes as they are or escaped); at most {MAX_READ_LENGTH} bytes, text or base64"
            )),
    ])
}

impl MicroagentServer {
    /// The inventory, then each workspace and its console log.
    pub(crate) async fn resource_list(&self) -> Result<ListResourcesResult, ErrorData> {
        let all = self
            .blocking(|ws| Ok(ws.list(&ListFilter::default())?))
            .await
            .map_err(|e| to_error(WORKSPACES_URI, e))?;
        let mut resources = vec![Resource::new(WORKSPACES_URI, "workspaces")
            .with_description("Every workspace, as workspace_list returns them")
            .with_mime_type(JSON)];
        for meta in all {
            let uri = format!("{WORKSPACE_PREFIX}{}", meta.name);
            resources.push(
                Resource::new(&uri, &meta.name)
                    .with_description(format!("Workspace {} ({})", meta.name, meta.state.as_str()))
                    .with_mime_type(JSON),
            );
            resources.push(
                Resource::new(format!("{uri}/logs"), format!("{}-logs", meta.name))
                    .with_description(format!("Console log of {}", meta.name))
                    .with_mime_type("text/plain"),
            );
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    /// Reads resource `uri`.
    pub(crate) async fn resource_read(&self, uri: &str) -> Result<ReadResourceResult, ErrorData> {
        let target = parse(uri).ok_or_else(|| {
            ErrorData::resource_not_found(
                format!("no resource {uri}: see resources/list and resources/templates/list"),
                Some(json!({"uri": uri, "code": "NOT_FOUND"})),
            )
        })?;
        let contents = self
            .contents(uri, target)
            .await
            .map_err(|e| to_error(uri, e))?;
        Ok(ReadResourceResult::new(vec![contents]))
    }

    async fn contents(&self, uri: &str, target: Target) -> Result<ResourceContents, ToolError> {
        let json_of = |value: serde_json::Value| {
            ResourceContents::text(value.to_string(), uri).with_mime_type(JSON)
        };
        match target {
            Target::Inventory => {
                let workspaces = self
                    .blocking(|ws| Ok(ws.list(&ListFilter::default())?))
                    .await?;
                let list = ListResult {
                    count: workspaces.len(),
                    workspaces,
                };
                Ok(json_of(serde_json::to_value(list).map_err(internal)?))
            }
            Target::Workspace(name) => {
                let info = self
                    .on_workspace(&name, |ws, name| ws.workspace(name)?.inspect())
                    .await?;
                Ok(json_of(serde_json::to_value(info).map_err(internal)?))
            }
            Target::Logs(name) => {
                let lines = self
                    .on_workspace(&name, |ws, name| {
                        ws.workspace(name)?.logs(Some(DEFAULT_LOG_LINES))
                    })
                    .await?;
                let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
                Ok(ResourceContents::text(text, uri).with_mime_type("text/plain"))
            }
            Target::File { name, path } => {
                let read = self
                    .ws
                    .workspace(&name)?
                    .files()
                    .read_file(&path, Some(0), Some(MAX_READ_LENGTH))
                    .await?;
                Ok(match String::from_utf8(read.data) {
                    Ok(text) => ResourceContents::text(text, uri).with_mime_type("text/plain"),
                    Err(e) => ResourceContents::blob(
                        base64::engine::general_purpose::STANDARD.encode(e.into_bytes()),
                        uri,
                    )
                    .with_mime_type("application/octet-stream"),
                })
            }
        }
    }
}

impl MicroagentServer {
    /// Follows file resource `uri` in `into`, telling `sink` of its
    /// changes (`resources/subscribe`, `subscriptions/listen`).
    pub(crate) async fn resource_subscribe(
        &self,
        uri: &str,
        into: &Subscriptions,
        sink: UpdateSink,
    ) -> Result<(), ErrorData> {
        let Some(target) = parse(uri) else {
            return Err(ErrorData::resource_not_found(
                format!("no resource {uri}: see resources/list and resources/templates/list"),
                Some(json!({"uri": uri, "code": "NOT_FOUND"})),
            ));
        };
        let Target::File { name, path } = target else {
            return Err(to_error(
                uri,
                ToolError::InvalidInput(format!(
                    "{uri} cannot be subscribed to: only file resources ({WORKSPACE_PREFIX}{{name}}/files/{{path}}) say when they change"
                )),
            ));
        };
        into.subscribe(uri, &name, &path, sink)
            .await
            .map_err(|e| to_error(uri, e))
    }

    /// What of `requested` a `subscriptions/listen` gets: file resources,
    /// at most [`MAX_SUBSCRIPTIONS`] of them.
    pub(crate) fn subscribable(requested: &SubscriptionFilter) -> SubscriptionFilter {
        let asked = requested
            .resource_subscriptions
            .as_deref()
            .unwrap_or_default();
        if asked.len() > MAX_REQUESTED {
            // Refused in `resource_listen`; nothing to compare meanwhile.
            return SubscriptionFilter::builder()
                .resource_subscriptions(Vec::<String>::new())
                .build();
        }
        let files: Vec<String> = asked
            .iter()
            .filter(|uri| matches!(parse(uri), Some(Target::File { .. })))
            .take(MAX_SUBSCRIPTIONS)
            .cloned()
            .collect();
        SubscriptionFilter::builder()
            .resource_subscriptions(files)
            .build()
    }

    /// One `subscriptions/listen`: its files followed until the request
    /// is cancelled or the session ends.
    pub(crate) async fn resource_listen(
        &self,
        listen: SubscriptionContext,
    ) -> Result<(), ErrorData> {
        let asked = listen.requested().resource_subscriptions.as_ref();
        if asked.is_some_and(|uris| uris.len() > MAX_REQUESTED) {
            return Err(to_error(
                "subscriptions/listen",
                ToolError::InvalidInput(format!(
                    "a listen may name at most {MAX_REQUESTED} resources"
                )),
            ));
        }
        let group = Subscriptions::new(self.ws.clone());
        let uris = listen.accepted().resource_subscriptions.clone();
        let mut followed = Ok(());
        for uri in uris.iter().flatten() {
            let sink = UpdateSink::Listen(listen.sink().clone());
            followed = self.resource_subscribe(uri, &group, sink).await;
            if followed.is_err() {
                break;
            }
        }
        if followed.is_ok() {
            // rmcp acknowledged the listen before this ran, and a client
            // may change a file as soon as it has the acknowledgment: one
            // update now that each is followed, so what changed between
            // the two is not lost (an update says "read it again").
            let sink = UpdateSink::Listen(listen.sink().clone());
            for uri in uris.iter().flatten() {
                sink.updated(uri).await;
            }
            tokio::select! {
                _ = listen.cancelled() => {}
                _ = self.subscriptions.ended() => {}
            }
        }
        group.close().await;
        followed
    }
}

fn internal(e: serde_json::Error) -> ToolError {
    ToolError::Internal(format!("encoding a resource: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_follows_file_resources_only_and_a_bounded_number() {
        let mut uris = vec![
            "microagent://workspace/dev/logs".to_owned(),
            "microagent://workspace/dev".to_owned(),
            WORKSPACES_URI.to_owned(),
            "file:///etc/passwd".to_owned(),
        ];
        uris.extend((0..20).map(|i| format!("microagent://workspace/dev/files/tmp/{i}")));
        let requested = SubscriptionFilter::builder()
            .resource_subscriptions(uris)
            .tools_list_changed()
            .build();
        let honoured = MicroagentServer::subscribable(&requested);
        let files = honoured.resource_subscriptions.unwrap();
        assert_eq!(files.len(), MAX_SUBSCRIPTIONS);
        assert_eq!(files[0], "microagent://workspace/dev/files/tmp/0");
        assert_eq!(honoured.tools_list_changed, None);
        let flood = SubscriptionFilter::builder()
            .resource_subscriptions(vec![
                "microagent://workspace/dev/files/x".to_owned();
                MAX_REQUESTED + 1
            ])
            .build();
        let refused = MicroagentServer::subscribable(&flood);
        assert_eq!(refused.resource_subscriptions, Some(vec![]));
        let none = MicroagentServer::subscribable(&SubscriptionFilter::default());
        assert_eq!(none.resource_subscriptions, Some(vec![]));
    }

    #[test]
    fn uris_name_their_targets() {
        assert_eq!(parse(WORKSPACES_URI), Some(Target::Inventory));
        assert_eq!(
            parse("microagent://workspace/dev"),
            Some(Target::Workspace("dev".into()))
        );
        assert_eq!(
            parse("microagent://workspace/dev/logs"),
            Some(Target::Logs("dev".into()))
        );
        let file = |path: &str| Target::File {
            name: "dev".into(),
            path: path.into(),
        };
        assert_eq!(
            parse("microagent://workspace/dev/files/etc/hostname"),
            Some(file("/etc/hostname"))
        );
        assert_eq!(
            parse("microagent://workspace/dev/files/%2Fetc%2Fhost%20name"),
            Some(file("/etc/host name"))
        );
        // What tool results link to is what reads.
        assert_eq!(
            parse(&crate::uris::file_uri("dev", "/etc/hostname")),
            Some(file("/etc/hostname"))
        );
        for bad in [
            "microagent://workspace/",
            "microagent://workspace/dev/other",
            "microagent://workspace/dev/files/%zz",
            "microagent://elsewhere",
            "file:///etc/passwd",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
