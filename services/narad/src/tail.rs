//! `narad tail`: follows a session (or the tenant) live and prints one JSON
//! line per frame, resuming across disconnects and replicas.

use std::io::Write;

use narad_client::{Client, Item};

/// What `narad tail` follows.
#[derive(clap::Args)]
pub struct TailArgs {
    /// The session to follow; without it, the tenant stream (every session
    /// of the token's tenant, live from now).
    pub session_id: Option<String>,
    #[command(flatten)]
    pub server: crate::servers::Servers,
    /// A bearer token (`narad token` mints a development one).
    #[arg(long, env = "NARAD_TOKEN", hide_env_values = true)]
    pub token: String,
    /// With a session: start after this sessionSequence (default: its
    /// first event).
    #[arg(long, conflicts_with = "last_event_id")]
    pub after: Option<u64>,
    /// Tenant stream: resume after this eventId.
    #[arg(long)]
    pub last_event_id: Option<String>,
    /// Print authority events only (no capabilities, watch or hydrate
    /// frames).
    #[arg(long)]
    pub authority_only: bool,
}

/// Follows until the stream is refused or no replica answers.
pub async fn tail(args: TailArgs) -> anyhow::Result<()> {
    let client = Client::new(args.server.servers, args.token);
    let mut follow = match (&args.session_id, &args.last_event_id) {
        (Some(s), None) => client.follow_session_after(s, args.after.unwrap_or(0)),
        (session, last) => client.follow_tenant(session.as_deref(), last.as_deref()),
    };
    let stdout = std::io::stdout();
    while let Some(item) = follow.next().await? {
        let line = match item {
            Item::Authority(e) => e,
            Item::ReplayGap(g) => {
                eprintln!(
                    "narad tail: the stream forgot events through {}; re-read history",
                    g["forgottenThrough"]
                );
                g
            }
            _ if args.authority_only => continue,
            Item::Capabilities(v) | Item::Hydrate(v) | Item::Watch(v) => v,
        };
        let mut out = stdout.lock();
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    Ok(())
}
