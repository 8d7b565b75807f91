//! A real S3-compatible server for tests of the object-store blob backend:
//! moto in server mode (PyPI `moto[server]`), one process per [`S3Server`],
//! ended when it is dropped.
//!
//! The binary is `NARAD_TEST_MOTO_SERVER` if set, else
//! `target/moto-venv/bin/moto_server` of the workspace (what
//! `scripts/test-all` installs), else `moto_server` on `PATH`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A running moto server on 127.0.0.1.
pub struct S3Server {
    endpoint: String,
    addr: String,
    child: std::sync::Mutex<Child>,
}

/// The moto server binary (see the module doc).
fn moto_binary() -> PathBuf {
    if let Ok(path) = std::env::var("NARAD_TEST_MOTO_SERVER") {
        return PathBuf::from(path);
    }
    let venv =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/moto-venv/bin/moto_server");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("moto_server")
}

impl S3Server {
    /// Starts moto on a free port and waits until it answers.
    pub async fn start() -> S3Server {
        let binary = moto_binary();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let child = Command::new(&binary)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot run {} ({e}): the S3 backend's tests need moto's server: \
                         python3 -m venv target/moto-venv && \
                         target/moto-venv/bin/pip install 'moto[server]==5.2.5' \
                         (scripts/test-all does), or set NARAD_TEST_MOTO_SERVER",
                        binary.display()
                    )
                });
            let addr = format!("127.0.0.1:{port}");
            let server = S3Server {
                endpoint: format!("http://{addr}"),
                addr,
                child: std::sync::Mutex::new(child),
            };
            for _ in 0..200 {
                if server.request("GET", "/").await.is_ok() {
                    return server;
                }
                if let Ok(Some(_)) = server.child.lock().expect("not poisoned").try_wait() {
                    break; // the port was taken meanwhile: another one
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        panic!("moto's server did not come up on 127.0.0.1");
    }

    /// Its endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The `AWS_*` variables that reach it.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", self.endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", "narad-test"),
            ("AWS_SECRET_ACCESS_KEY", "narad-test"),
            ("AWS_REGION", "us-east-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Creates bucket `name`.
    pub async fn create_bucket(&self, name: &str) {
        let status = self
            .request("PUT", &format!("/{name}"))
            .await
            .expect("moto answers");
        assert_eq!(status, 200, "creating bucket {name}");
    }

    /// How many objects of `bucket` have keys beginning with `prefix`
    /// (at most 1,000: one listing page).
    pub async fn count_objects(&self, bucket: &str, prefix: &str) -> usize {
        let path = format!("/{bucket}?list-type=2&prefix={}", encode(prefix));
        let (status, body) = self.exchange("GET", &path).await.expect("moto answers");
        assert_eq!(status, 200, "listing {bucket}: {body}");
        body.matches("<Key>").count()
    }

    async fn request(&self, method: &str, path: &str) -> std::io::Result<u16> {
        Ok(self.exchange(method, path).await?.0)
    }

    /// One HTTP/1.1 request without a body: the status and the body.
    async fn exchange(&self, method: &str, path: &str) -> std::io::Result<(u16, String)> {
        let mut stream = tokio::net::TcpStream::connect(&self.addr).await?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: 0\r\n\
             connection: close\r\n\r\n",
            self.addr
        );
        stream.write_all(head.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not HTTP: {text:.80}")))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    }
}

/// `text` percent-encoded for a query string.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl S3Server {
    /// Ends the server (an outage of the store).
    pub fn kill(&self) {
        let mut child = self.child.lock().expect("not poisoned");
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}
