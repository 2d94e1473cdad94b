//! Tests of the loader: the ncclConfig_t layout, the ABI table against
//! NCCL's own header, versions and the search order.

use super::*;

#[test]
fn config_layout_matches_nccl_2_28() {
    // Offsets of ncclConfig_v22800 on LP64.
    assert_eq!(std::mem::offset_of!(Config, magic), 8);
    assert_eq!(std::mem::offset_of!(Config, blocking), 16);
    assert_eq!(std::mem::offset_of!(Config, net_name), 32);
    assert_eq!(std::mem::offset_of!(Config, split_share), 40);
    assert_eq!(std::mem::offset_of!(Config, traffic_class), 44);
    assert_eq!(std::mem::offset_of!(Config, comm_name), 48);
    assert_eq!(std::mem::offset_of!(Config, nvls_ctas), 68);
    assert_eq!(std::mem::size_of::<Config>(), 80);
    let c = Config::new(version_code(2, 28, 9));
    assert_eq!(c.size, 80);
    assert_eq!(c.version, 22809);
    assert_eq!(c.blocking, i32::MIN);
    assert_eq!(std::mem::size_of::<UniqueId>(), 128);
    // `version` names the layout `size` describes: an older library's
    // own version, never one newer than 2.28.9's layout.
    assert_eq!(Config::new(version_code(2, 21, 5)).version, 22105);
    assert_eq!(Config::new(version_code(2, 32, 3)).version, 22809);
    assert_eq!(Config::new(version_code(2, 32, 3)).size, 80);
}

/// The ABI test's table names exactly the symbols `from_handle`
/// resolves (so that no entry point escapes the header comparison).
#[test]
fn signature_table_covers_every_resolved_symbol() {
    let src = include_str!("mod.rs");
    let start = src.find("pub unsafe fn from_handle").unwrap();
    let end = start + src[start..].find("pub fn version_string").unwrap();
    let mut resolved: Vec<&str> = src[start..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|w| w.starts_with("nccl") && w.chars().all(|c| c.is_ascii_alphanumeric()))
        .collect();
    resolved.sort();
    resolved.dedup();
    let mut table: Vec<&str> = abi::table().iter().map(|(n, _, _)| *n).collect();
    table.sort();
    assert_eq!(resolved, table);
    // Required symbols are the ones resolved with req!.
    for (name, _, required) in abi::table() {
        assert_eq!(
            src[start..end].contains(&format!("req!(\"{name}\")")),
            required,
            "{name}"
        );
    }
}

#[test]
fn c_prototypes_are_parsed() {
    let h = "/* a ncclGroupEnd() call */\nncclResult_t  ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,\n    \
             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);\n\
             ncclResult_t pncclGroupEnd();\nncclResult_t  ncclGroupEnd();\nconst char*  ncclGetLastError(ncclComm_t comm);\n\
             ncclResult_t ncclSignal(int peer, unsigned int flags, ncclUniqueId id, ncclComm_t *c);\n";
    let get = |n| abi::c_signature(h, n).map(|r| r.unwrap());
    assert_eq!(get("ncclAllReduce").as_deref(), Some("i(p,p,z,i,i,p,p)"));
    assert_eq!(get("ncclGroupEnd").as_deref(), Some("i()"));
    assert_eq!(get("ncclGetLastError").as_deref(), Some("p(p)"));
    assert_eq!(get("ncclSignal").as_deref(), Some("i(i,u,id,p)"));
    assert_eq!(get("ncclBroadcast"), None);
    assert_eq!(
        abi::table()
            .iter()
            .find(|t| t.0 == "ncclAllReduce")
            .unwrap()
            .1,
        "i(p,p,z,i,i,p,p)"
    );
}

/// Compiles tests/nccl_abi/nccl_abi.c against the nccl.h named by
/// TORCHCOMM_TEST_NCCL_HEADER (CUDA headers stubbed), runs it, and
/// compares its sizes, offsets, initializer values and constants with
/// this file's; then compares every entry point's Rust type with the
/// header's prototype. `make nccl-real-test` sets the variable from the
/// nvidia-nccl-cu13 wheel.
#[test]
fn abi_matches_the_nccl_header() {
    let Some(header) = std::env::var("TORCHCOMM_TEST_NCCL_HEADER")
        .ok()
        .filter(|p| !p.is_empty())
    else {
        println!("SKIPPED abi_matches_the_nccl_header: TORCHCOMM_TEST_NCCL_HEADER is not set (make nccl-wheel fetches nccl.h)");
        return;
    };
    let header = std::path::PathBuf::from(header);
    let text =
        std::fs::read_to_string(&header).unwrap_or_else(|e| panic!("{}: {e}", header.display()));
    let c = probe_header(&header);
    let hv = c["header NCCL_VERSION_CODE"] as i32;
    let mut d = Diffs::default();
    check_sizes(&c, &mut d);
    let (c_size, ours_size, beyond) = check_config(&c, hv, &mut d);
    check_constants(&c, hv, &mut d);
    let constants = d.checked;
    let (functions, absent) = check_prototypes(&text, &mut d.bad);
    let bad = d.bad;
    assert!(
        bad.is_empty(),
        "nccl_loader/mod.rs differs from NCCL {}'s nccl.h ({}):\n  {}",
        version_string(hv),
        header.display(),
        bad.join("\n  ")
    );
    println!(
        "abi_matches_the_nccl_header: NCCL {} ({}): {constants} sizes/offsets/values and {functions} prototypes match; \
         ncclConfig_t {c_size} bytes there, {ours_size} ours{}{}",
        version_string(hv),
        header.display(),
        if beyond.is_empty() { String::new() } else { format!(" (fields past its end, unread by it: {})", beyond.join(", ")) },
        if absent.is_empty() { String::new() } else { format!("; optional, not in this version: {}", absent.join(", ")) },
    );
}

/// Compiles tests/nccl_abi/nccl_abi.c against `header` (CUDA headers
/// stubbed), runs it, and returns what it printed: each key (e.g. "sizeof
/// ncclComm_t", "const ncclSum", "init ncclConfig_t.magic") with its value.
fn probe_header(header: &std::path::Path) -> std::collections::HashMap<String, i64> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nccl_abi");
    let exe = std::env::temp_dir().join(format!("tc-nccl-abi-{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
        .args(["-std=c11", "-Wall", "-I"])
        .arg(dir.join("cuda_stub"))
        .arg("-I")
        .arg(header.parent().unwrap())
        .arg(dir.join("nccl_abi.c"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("{cc}: {e}"));
    assert!(
        out.status.success(),
        "compiling nccl_abi.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = std::process::Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_file(&exe);
    assert!(run.status.success());
    let mut c = std::collections::HashMap::new();
    for line in String::from_utf8(run.stdout).unwrap().lines() {
        let (key, value) = line.rsplit_once(' ').unwrap();
        c.insert(key.to_string(), value.parse::<i64>().unwrap());
    }
    c
}

/// What differs between nccl.h and nccl_loader/mod.rs, and how many values were
/// compared.
#[derive(Default)]
struct Diffs {
    bad: Vec<String>,
    checked: usize,
}

impl Diffs {
    fn same(&mut self, what: &str, c_value: i64, ours: i64) {
        self.checked += 1;
        if c_value != ours {
            self.bad.push(format!(
                "{what}: nccl.h has {c_value}, nccl_loader/mod.rs has {ours}"
            ));
        }
    }
}

/// Version macros, type sizes and the ncclWaitSignalDesc_t layout.
fn check_sizes(c: &std::collections::HashMap<String, i64>, d: &mut Diffs) {
    d.same(
        "NCCL_VERSION(2,28,9)",
        c["header NCCL_VERSION(2,28,9)"],
        version_code(2, 28, 9) as i64,
    );
    d.same(
        "NCCL_VERSION(2,8,4)",
        c["header NCCL_VERSION(2,8,4)"],
        version_code(2, 8, 4) as i64,
    );
    let sizes: [(&str, usize); 6] = [
        ("ncclUniqueId", std::mem::size_of::<UniqueId>()),
        ("ncclComm_t", std::mem::size_of::<NcclComm>()),
        ("ncclResult_t", std::mem::size_of::<NcclResult>()),
        ("ncclDataType_t", std::mem::size_of::<NcclDataType>()),
        ("ncclRedOp_t", std::mem::size_of::<NcclRedOp>()),
        ("ncclScalarResidence_t", std::mem::size_of::<c_int>()),
    ];
    for (name, ours) in sizes {
        d.same(
            &format!("sizeof({name})"),
            c[&format!("sizeof {name}")],
            ours as i64,
        );
    }
    if let Some(v) = c.get("sizeof ncclWindow_t") {
        d.same(
            "sizeof(ncclWindow_t)",
            *v,
            std::mem::size_of::<NcclWindow>() as i64,
        );
    }
    if let Some(v) = c.get("sizeof ncclWaitSignalDesc_t") {
        d.same(
            "sizeof(ncclWaitSignalDesc_t)",
            *v,
            std::mem::size_of::<WaitSignalDesc>() as i64,
        );
        for (f, ours) in [
            ("opCnt", std::mem::offset_of!(WaitSignalDesc, op_cnt)),
            ("peer", std::mem::offset_of!(WaitSignalDesc, peer)),
            ("sigIdx", std::mem::offset_of!(WaitSignalDesc, sig_idx)),
            ("ctx", std::mem::offset_of!(WaitSignalDesc, ctx)),
        ] {
            d.same(
                &format!("offsetof(ncclWaitSignalDesc_t, {f})"),
                c[&format!("offsetof ncclWaitSignalDesc_t.{f}")],
                ours as i64,
            );
        }
    }
}

/// Every field of our ncclConfig_t: (name in nccl.h, our offset, our
/// initializer's value for NCCL version `hv`).
fn config_fields(hv: i32) -> [(&'static str, usize, i64); 17] {
    use std::mem::offset_of;
    let init = Config::new(hv);
    // (name, our field): its offset and initial value; `non_null` for a
    // pointer field, whose value is whether it is set.
    macro_rules! field {
        ($c:literal, $ours:ident) => {
            ($c, offset_of!(Config, $ours), init.$ours as i64)
        };
        ($c:literal, $ours:ident, non_null) => {
            ($c, offset_of!(Config, $ours), !init.$ours.is_null() as i64)
        };
    }
    [
        field!("size", size),
        field!("magic", magic),
        field!("version", version),
        field!("blocking", blocking),
        field!("cgaClusterSize", cga_cluster_size),
        field!("minCTAs", min_ctas),
        field!("maxCTAs", max_ctas),
        field!("netName", net_name, non_null),
        field!("splitShare", split_share),
        field!("trafficClass", traffic_class),
        field!("commName", comm_name, non_null),
        field!("collnetEnable", collnet_enable),
        field!("CTAPolicy", cta_policy),
        field!("shrinkShare", shrink_share),
        field!("nvlsCTAs", nvls_ctas),
        field!("nChannelsPerNetPeer", n_channels_per_net_peer),
        field!("nvlinkCentricSched", nvlink_centric_sched),
    ]
}

/// ncclConfig_t: every field of ours at the header's offset, or (an older
/// header) past the end of the header's struct, which that NCCL does not
/// read; our initializer equal to the header's. Returns the header's size,
/// ours, and our fields past the header's end.
fn check_config(
    c: &std::collections::HashMap<String, i64>,
    hv: i32,
    d: &mut Diffs,
) -> (i64, i64, Vec<&'static str>) {
    let c_size = c["sizeof ncclConfig_t"];
    let ours_size = std::mem::size_of::<Config>() as i64;
    let fields = config_fields(hv);
    let mut beyond = Vec::new();
    for (f, off, value) in fields {
        match c.get(&format!("offsetof ncclConfig_t.{f}")) {
            Some(c_off) => {
                d.same(&format!("offsetof(ncclConfig_t, {f})"), *c_off, off as i64);
                let c_init = c[&format!("init ncclConfig_t.{f}")];
                match f {
                    // Ours describes our struct: its size, and the
                    // header's version up to our layout's.
                    "size" => {
                        d.same("NCCL_CONFIG_INITIALIZER.size", c_init, c_size);
                        d.same("Config::new().size", value, ours_size);
                    }
                    "version" => d.same(
                        "NCCL_CONFIG_INITIALIZER.version (ours: up to the layout's)",
                        c_init.min(CONFIG_LAYOUT_VERSION as i64),
                        value,
                    ),
                    _ => d.same(&format!("NCCL_CONFIG_INITIALIZER.{f}"), c_init, value),
                }
            }
            None if (off as i64) >= c_size => beyond.push(f),
            None => d.bad.push(format!(
                "ncclConfig_t.{f}: not in nccl.h, yet inside its {c_size}-byte struct"
            )),
        }
    }
    if hv / 100 == CONFIG_LAYOUT_VERSION / 100 {
        d.same(
            "sizeof(ncclConfig_t) (the layout's own version)",
            c_size,
            ours_size,
        );
    } else if c_size < ours_size && beyond.is_empty() {
        d.bad.push(format!(
            "sizeof(ncclConfig_t) is {c_size} but no field of ours lies past it"
        ));
    }
    (c_size, ours_size, beyond)
}

/// The constants: (name in nccl.h, ours, the NCCL version it exists from).
fn constants() -> [(&'static str, i64, i32); 31] {
    // The versions some constants exist from.
    const V2_24: i32 = version_code(2, 24, 0);
    const V2_27: i32 = version_code(2, 27, 0);
    const V2_29: i32 = version_code(2, 29, 0);
    const V2_30: i32 = version_code(2, 30, 0);
    [
        ("NCCL_CONFIG_UNDEF_INT", NCCL_CONFIG_UNDEF_INT as i64, 0),
        ("NCCL_SPLIT_NOCOLOR", NCCL_SPLIT_NOCOLOR as i64, 0),
        ("NCCL_SHRINK_DEFAULT", NCCL_SHRINK_DEFAULT as i64, V2_27),
        ("NCCL_SHRINK_ABORT", NCCL_SHRINK_ABORT as i64, V2_27),
        ("NCCL_API_MAGIC", NCCL_API_MAGIC as i64, V2_29),
        ("ncclSuccess", NCCL_SUCCESS as i64, 0),
        (
            "ncclUnhandledCudaError",
            NCCL_UNHANDLED_CUDA_ERROR as i64,
            0,
        ),
        ("ncclSystemError", NCCL_SYSTEM_ERROR as i64, 0),
        ("ncclInternalError", NCCL_INTERNAL_ERROR as i64, 0),
        ("ncclInvalidArgument", NCCL_INVALID_ARGUMENT as i64, 0),
        ("ncclInvalidUsage", NCCL_INVALID_USAGE as i64, 0),
        ("ncclRemoteError", NCCL_REMOTE_ERROR as i64, 0),
        ("ncclInProgress", NCCL_IN_PROGRESS as i64, 0),
        ("ncclTimeout", NCCL_TIMEOUT as i64, V2_30),
        ("ncclInt8", NCCL_INT8 as i64, 0),
        ("ncclUint8", NCCL_UINT8 as i64, 0),
        ("ncclInt32", NCCL_INT32 as i64, 0),
        ("ncclUint32", NCCL_UINT32 as i64, 0),
        ("ncclInt64", NCCL_INT64 as i64, 0),
        ("ncclUint64", NCCL_UINT64 as i64, 0),
        ("ncclFloat16", NCCL_FLOAT16 as i64, 0),
        ("ncclFloat32", NCCL_FLOAT32 as i64, 0),
        ("ncclFloat64", NCCL_FLOAT64 as i64, 0),
        ("ncclBfloat16", NCCL_BFLOAT16 as i64, 0),
        ("ncclFloat8e4m3", NCCL_FLOAT8_E4M3 as i64, V2_24),
        ("ncclFloat8e5m2", NCCL_FLOAT8_E5M2 as i64, V2_24),
        ("ncclSum", NCCL_SUM as i64, 0),
        ("ncclProd", NCCL_PROD as i64, 0),
        ("ncclMax", NCCL_MAX as i64, 0),
        ("ncclMin", NCCL_MIN as i64, 0),
        ("ncclAvg", NCCL_AVG as i64, 0),
    ]
}

/// The constants, where the header's version has them, and the values
/// nccl.h defines otherwise.
fn check_constants(c: &std::collections::HashMap<String, i64>, hv: i32, d: &mut Diffs) {
    let consts = constants();
    for (name, ours, since) in consts {
        match c.get(&format!("const {name}")) {
            Some(v) => d.same(name, *v, ours),
            None if hv < since => {}
            None => d.bad.push(format!(
                "{name}: missing from NCCL {} header",
                version_string(hv)
            )),
        }
    }
    if !c.contains_key("const NCCL_API_MAGIC") {
        d.same(
            "NCCL_CONFIG_INITIALIZER.magic",
            c["init ncclConfig_t.magic"],
            NCCL_API_MAGIC as i64,
        );
    }
    d.same(
        "ncclScalarDevice",
        c["const ncclScalarDevice"],
        NCCL_SCALAR_DEVICE as i64,
    );
    d.same(
        "ncclScalarHostImmediate",
        c["const ncclScalarHostImmediate"],
        NCCL_SCALAR_HOST_IMMEDIATE as i64,
    );
    // PreMulSum ops are numbered from ncclNumOps: the built-in list is ours.
    d.same("ncclNumOps", c["const ncclNumOps"], NCCL_AVG as i64 + 1);
    if let Some(v) = c.get("const NCCL_WIN_DEFAULT") {
        d.same("NCCL_WIN_DEFAULT", *v, NCCL_WIN_DEFAULT as i64);
        d.same(
            "NCCL_WIN_COLL_SYMMETRIC",
            c["const NCCL_WIN_COLL_SYMMETRIC"],
            NCCL_WIN_COLL_SYMMETRIC as i64,
        );
    }
}

/// Entry points: the Rust type of each against the header's prototype.
/// Returns how many matched and the optional ones the header lacks.
fn check_prototypes(text: &str, bad: &mut Vec<String>) -> (usize, Vec<&'static str>) {
    let mut functions = 0;
    let mut absent = Vec::new();
    for (name, ours, required) in abi::table() {
        match abi::c_signature(text, name) {
            Some(Ok(theirs)) => {
                functions += 1;
                if theirs != ours {
                    bad.push(format!(
                        "{name}: nccl.h declares {theirs}, nccl_loader/mod.rs calls it as {ours}"
                    ));
                }
            }
            Some(Err(e)) => bad.push(e),
            None if required => bad.push(format!(
                "{name}: required by nccl_loader/mod.rs, not declared in nccl.h"
            )),
            None => absent.push(name),
        }
    }
    (functions, absent)
}

#[test]
fn version_codes() {
    assert_eq!(version_code(2, 28, 9), 22809);
    assert_eq!(version_code(2, 8, 4), 2804);
    assert_eq!(version_string(22809), "2.28.9");
    assert_eq!(version_string(2804), "2.8.4");
}

#[test]
fn explicit_path_that_fails_names_the_path() {
    // Only meaningful when no NCCL is already loaded in this test process.
    if dlopen("libnccl.so.2", libc::RTLD_NOW | libc::RTLD_NOLOAD).is_ok() {
        return;
    }
    let e = open(Some("/nonexistent/libnccl.so.2")).expect_err("must fail");
    assert_eq!(e.kind, ErrorKind::Unavailable);
    assert!(
        e.message
            .contains("TORCHCOMM_NCCL_LIBRARY=/nonexistent/libnccl.so.2"),
        "{}",
        e.message
    );
}

#[test]
fn a_library_without_nccl_symbols_is_rejected() {
    let (h, origin) = match dlopen("libc.so.6", libc::RTLD_NOW) {
        Ok(h) => (h, "libc.so.6".to_string()),
        Err(_) => return,
    };
    let e = unsafe { Nccl::from_handle(h, origin) }
        .err()
        .expect("libc is not NCCL");
    assert_eq!(e.kind, ErrorKind::Unavailable);
    assert!(e.message.contains("ncclGetVersion"), "{}", e.message);
}

#[test]
fn default_search_either_loads_or_says_what_it_looked_for() {
    match open(None) {
        Ok((h, origin)) => {
            let lib =
                unsafe { Nccl::from_handle(h, origin) }.expect("a found libnccl must resolve");
            assert!(lib.version >= version_code(2, 18, 0));
        }
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::Unavailable);
            assert!(
                e.message.contains("libnccl.so.2") && e.message.contains("TORCHCOMM_NCCL_LIBRARY"),
                "{}",
                e.message
            );
        }
    }
}
