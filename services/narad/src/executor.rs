//! `narad executor`: a demonstration client executor with two harmless
//! tools, `echo` and `clock.now`, built on the SDK's executor runtime.

use std::path::PathBuf;

use narad_client::{Executor, FileTokenStore, ToolResult};
use narad_protocol::primitives::Timestamp;
use serde_json::{Value, json};

/// What `narad executor` attaches as, and where.
#[derive(clap::Args)]
pub struct ExecutorArgs {
    /// The clientExecutorId to attach as.
    #[arg(long)]
    pub id: String,
    #[command(flatten)]
    pub server: crate::servers::Servers,
    /// A bearer token of role `executor` (`narad token` mints a
    /// development one).
    #[arg(long, env = "NARAD_TOKEN", hide_env_values = true)]
    pub token: String,
    /// The durable token store (default: ./narad-executor-ID.tokens).
    #[arg(long)]
    pub store: Option<PathBuf>,
}

/// Runs the executor until Ctrl-C.
pub async fn executor(args: ExecutorArgs) -> anyhow::Result<()> {
    let path = args
        .store
        .unwrap_or_else(|| PathBuf::from(format!("./narad-executor-{}.tokens", args.id)));
    let store = FileTokenStore::open(&path)
        .map_err(|e| anyhow::anyhow!("opening the token store {}: {e}", path.display()))?;
    let executor = Executor::builder(args.server.servers, args.token, args.id)
        .tool(
            "echo",
            |args| async move { ToolResult::ok(Value::Object(args)) },
        )
        .tool("clock.now", |_| async {
            ToolResult::ok(json!({ "now": Timestamp::now().as_str() }))
        })
        .store(store)
        .build()?;
    tracing::info!(store = %path.display(), "executor starting; Ctrl-C stops it");
    executor
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
