//! Rebuilds the binary when the conformance traces it carries change
//! (`narad conformance server` has them built in).

fn main() {
    println!("cargo:rerun-if-changed=../../conformance/traces");
}
