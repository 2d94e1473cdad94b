//! Link settings of the shared library: its soname and the export list; and
//! the Gloo backend module `libtorchcomm-gloo.so`, built beside the library
//! when Gloo's headers are installed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtorchcomm.so.{major}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/torchcomm.map");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=torchcomm.map");
    build_gloo_module(Path::new(&dir));
}

/// The directory that receives libtorchcomm.so: OUT_DIR is
/// `<target>/<profile>/build/<package>-<hash>/out`.
fn artifact_dir() -> Option<PathBuf> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR")?);
    Some(out.ancestors().nth(3)?.to_path_buf())
}

/// Compiles gloo_shim/tc_gloo.cc into `libtorchcomm-gloo.so`, linked against
/// Debian's libgloo. Without Gloo's headers the module is skipped with a
/// warning; the library then reports the gloo backend as unavailable.
fn build_gloo_module(dir: &Path) {
    let src = dir.join("gloo_shim/tc_gloo.cc");
    println!("cargo:rerun-if-changed={}", src.display());
    println!(
        "cargo:rerun-if-changed={}",
        dir.join("gloo_shim/tc_gloo.h").display()
    );
    println!("cargo:rerun-if-env-changed=TORCHCOMM_GLOO_INCLUDE_DIR");
    let include = std::env::var_os("TORCHCOMM_GLOO_INCLUDE_DIR").map(PathBuf::from);
    let header_dirs: Vec<PathBuf> = include
        .iter()
        .cloned()
        .chain([
            PathBuf::from("/usr/include"),
            PathBuf::from("/usr/local/include"),
        ])
        .collect();
    if !header_dirs
        .iter()
        .any(|d| d.join("gloo/allreduce.h").exists())
    {
        println!(
            "cargo:warning=Gloo headers not found (apt-get install libgloo-dev); building without the gloo backend module"
        );
        return;
    }
    let Some(target_dir) = artifact_dir() else {
        println!(
            "cargo:warning=cannot locate the target directory; skipping the gloo backend module"
        );
        return;
    };
    let compiler = cc::Build::new().cpp(true).opt_level(2).get_compiler();
    let output = target_dir.join("libtorchcomm-gloo.so");
    let mut cmd: Command = compiler.to_command();
    cmd.args([
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-Wall",
        "-fvisibility=hidden",
    ]);
    if let Some(inc) = &include {
        cmd.arg(format!("-I{}", inc.display()));
    }
    cmd.arg(&src).arg("-o").arg(&output);
    cmd.args([
        "-Wl,-soname,libtorchcomm-gloo.so",
        "-Wl,--no-undefined",
        "-lgloo",
        "-lpthread",
    ]);
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("compiling {} failed ({s}): {cmd:?}", src.display()),
        Err(e) => panic!(
            "running the C++ compiler for {}: {e}: {cmd:?}",
            src.display()
        ),
    }
}
