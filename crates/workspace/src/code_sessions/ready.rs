//! Kernels made ahead: a kernel's start imports ipykernel, which where
//! guest kernel mode is emulated takes minutes (12 min measured alone).
//! [`prepare`] pays it once per image: a fresh workspace of the image's
//! default size boots in a namespace of the library's own, starts the
//! kernel server (`server`) and a kernel of each language as background
//! process `code-ready-<language>`, and is
//! kept as the image's warm snapshot (`snapshots/warm.rs`). Every fresh
//! workspace of that size (a warm start, a pool member) resumes with those
//! kernels running, and its first session of a language takes its kernel
//! ([`adopt`]) instead of starting one. What a taken kernel hands the host
//! is guest data, read as any kernel's is.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::jupyter::READY_TIMEOUT;
use super::launch::{self, FIRST_ANSWER_TIMEOUT};
use super::records::SessionRecord;
use super::server;
use super::{CodeLanguage, CodeSessionError};
use crate::error::Result;
use crate::workspaces::handle::Workspace;
use crate::workspaces::lifecycle::DEFAULT_START_TIMEOUT;
use crate::workspaces::manager::{ListFilter, Workspaces};
use base::host::settings::{now_ms, unique_id};
use base::store::spec::{DeleteOptions, Owner, WorkspaceSpec};
use base::store::workspace_dir::WorkspaceDir;

pub use crate::workspaces::tenancy::READY_NAMESPACE;
/// The connection files of kernels made ahead are named with this in
/// place of a random nonce: the session that takes one must find it.
const READY_NONCE: &str = "ready";
/// How long the workspace that makes them may live (each kernel's start
/// is bounded apart; this ends one whose maker was killed).
const MAKER_TTL_SECS: u64 = 4 * 3600;
/// How long a kernel made ahead has to drop the maker's connections
/// before the snapshot (they would be reset in every fresh workspace).
const SETTLE_BEFORE_SNAPSHOT: Duration = Duration::from_secs(5);
/// What a taken Python kernel runs first: its `random` was seeded before
/// the snapshot, the same in every workspace; the guest's entropy is
/// fresh after a resume.
const RESEED_PYTHON: &str =
    "import random as _microagent_random\n_microagent_random.seed()\ndel _microagent_random\n";

/// The background process of a kernel of `language` made ahead.
fn process_id(language: CodeLanguage) -> String {
    format!("code-ready-{}", language.as_str())
}

/// What [`prepare`] made.
#[derive(Debug, Clone, Serialize)]
pub struct PreparedKernels {
    /// The image.
    pub image: String,
    /// Its warm snapshot's key (image, size, kernel, network).
    pub warm_key: String,
    /// The kernels running in it.
    pub languages: Vec<CodeLanguage>,
    /// How long it took, in seconds.
    pub secs: f64,
}

/// Makes the warm snapshot of `image` (at its default size) one with a
/// kernel of each of `languages` running, in place of the one there.
/// `progress` hears each step. Minutes where guest kernel mode is
/// emulated; once per image and kernel.
pub async fn prepare(
    all: &Workspaces,
    image: &str,
    languages: &[CodeLanguage],
    mut progress: impl FnMut(&str),
) -> Result<PreparedKernels> {
    let began = Instant::now();
    let image = all.image_registry().get(image)?.name;
    let mut languages = languages.to_vec();
    let mut seen = Vec::new();
    languages.retain(|l| {
        let first = !seen.contains(l);
        seen.push(*l);
        first
    });
    if languages.is_empty() {
        return Err(crate::error::Error::InvalidInput(
            "name at least one language to make a kernel of".into(),
        ));
    }
    // Makers whose process was killed go first (a listing deletes a
    // workspace whose owner ended with it).
    let _ = all.list_everywhere(&ListFilter::default());
    let view = all.reserved_view(READY_NAMESPACE);
    // Stopped by its VMM, then deleted, when this process ends early.
    let owner = Owner::this_process().ok_or_else(|| {
        crate::error::Error::HostUnsupported("/proc does not say when this process started".into())
    })?;
    let spec = WorkspaceSpec {
        ttl_secs: Some(MAKER_TTL_SECS),
        owner: Some(owner),
        delete_with_owner: true,
        ..crate::pool::member_spec(&image, &all.image_defaults(&image))
    };
    let name = format!("maker-{}.{READY_NAMESPACE}", unique_id());
    view.create(&name, spec)?;
    let made = async {
        let ws = view.at(&name);
        progress(&format!("booting a fresh workspace of {image}"));
        let meta = ws.start_cold(DEFAULT_START_TIMEOUT, |_| {}).await?;
        let ws_dir = view.dir(&name)?;
        progress("starting the kernel server (importing ipykernel: minutes here)");
        server::ensure(ws, languages[0]).await?;
        for &language in &languages {
            progress(&format!(
                "starting a {} kernel (forked by the server)",
                language.as_str()
            ));
            let process = process_id(language);
            let record = server::start(ws, &process, READY_NONCE, language).await?;
            let mut client = launch::connect(&ws_dir, &record, FIRST_ANSWER_TIMEOUT).await?;
            if language == CodeLanguage::Python {
                // Its first run's own costs, paid here once.
                client
                    .execute_silently("pass", FIRST_ANSWER_TIMEOUT)
                    .await
                    .map_err(CodeSessionError::from)?;
            }
        }
        tokio::time::sleep(SETTLE_BEFORE_SNAPSHOT).await;
        progress("keeping it as the image's warm snapshot");
        let names = languages.iter().map(|l| l.as_str().to_owned()).collect();
        if let Some(why) = view.snapshots().keep_warm_from(&name, names).await? {
            return Err(CodeSessionError::NotKept {
                image: image.clone(),
                why,
            }
            .into());
        }
        let (warm_key, _) = all.warm_identity(&meta.spec)?;
        Ok::<_, crate::error::Error>(warm_key)
    }
    .await;
    let _ = view.at(&name).delete(DeleteOptions::default().force(true));
    Ok(PreparedKernels {
        image,
        warm_key: made?,
        languages,
        secs: began.elapsed().as_secs_f64(),
    })
}

/// The kernels made ahead that a fresh workspace of `spec` would resume
/// with now.
pub fn ready_for(all: &Workspaces, spec: &WorkspaceSpec) -> Vec<CodeLanguage> {
    all.snapshots()
        .warm_ready_kernels(spec)
        .iter()
        .filter_map(|l| l.parse().ok())
        .collect()
}

/// Session `id`'s record for the kernel of `language` made ahead in this
/// workspace, once it answers: `None` when there is none, another session
/// (in `records`) has it, or it does not answer (it is then ended; the
/// session starts its own).
pub(super) async fn adopt(
    ws: Workspace<'_>,
    ws_dir: &WorkspaceDir,
    id: &str,
    language: CodeLanguage,
    records: &[SessionRecord],
) -> Option<SessionRecord> {
    let process = process_id(language);
    if records.iter().any(|r| r.process() == process) {
        return None;
    }
    let list = ws.processes().process_list().await.ok()?;
    let found = list.into_iter().find(|p| p.id == process)?;
    let taken = async {
        if !found.running() {
            return Err(launch::start_failed(
                ws,
                language,
                found.status().to_string(),
            ));
        }
        let file = launch::connection_file(&process, READY_NONCE);
        let owner = launch::process_owner(ws, found.pid).await?;
        let json = launch::read_guest_json(ws, &file, owner).await?;
        let parsed = json.as_ref().map(launch::parse_connection).transpose()?;
        let Some(ports) = parsed.flatten() else {
            return Err(launch::start_failed(
                ws,
                language,
                "its connection file is not whole".into(),
            ));
        };
        let record = SessionRecord {
            id: id.to_owned(),
            language,
            process: Some(process.clone()),
            pid: found.pid,
            started_unix_ms: found.started_unix_ms,
            created_unix_ms: now_ms(),
            ..ports
        };
        let mut client = launch::connect(ws_dir, &record, READY_TIMEOUT).await?;
        if language == CodeLanguage::Python {
            let run = client
                .execute_silently(RESEED_PYTHON, READY_TIMEOUT)
                .await
                .map_err(CodeSessionError::from)?;
            if let Some(error) = run.error {
                return Err(launch::start_failed(
                    ws,
                    language,
                    format!("reseeding raised {}", error.name),
                ));
            }
            if let Some(stopped) = run.stopped {
                return Err(launch::start_failed(
                    ws,
                    language,
                    format!("reseeding {stopped}"),
                ));
            }
        }
        // Taken: a fork of this workspace must not take it again (with
        // this session's state); the host holds what the file said.
        ws.files().remove(&file, false, false).await?;
        Ok(record)
    };
    match taken.await {
        Ok(record) => Some(record),
        Err(e) => {
            tracing::info!(
                "the {} kernel made ahead in {} is not taken: {e}",
                language.as_str(),
                ws.name.as_str()
            );
            let _ = launch::end_process(ws, &process).await;
            None
        }
    }
}
