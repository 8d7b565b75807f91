//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!`
//! embeds the files at compile time, and cargo does not watch them itself.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
