//! The `--server` option of the commands that talk to a running narad.

/// The replicas to talk to, in the order they are tried.
#[derive(clap::Args)]
pub struct Servers {
    /// A replica's base URL; repeat it (or separate with commas) to fail
    /// over between replicas.
    #[arg(
        long = "server",
        env = "NARAD_SERVER",
        default_value = "http://127.0.0.1:8080",
        value_delimiter = ','
    )]
    pub servers: Vec<String>,
}
