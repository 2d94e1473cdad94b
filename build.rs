//! Link settings of the shared library: its soname and the export list.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtorchcomm.so.{major}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/torchcomm.map");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=torchcomm.map");
}
