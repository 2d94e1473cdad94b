//! Writes the C header generated from the crate's sources to the path given
//! as the first argument (`make header`, `make header-check`).

fn main() {
    let out = std::env::args().nth(1).expect("usage: gen_header OUTPUT.h");
    let dir = env!("CARGO_MANIFEST_DIR");
    let config =
        cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("reading cbindgen.toml");
    cbindgen::generate_with_config(dir, config)
        .expect("generating the header")
        .write_to_file(&out);
}
