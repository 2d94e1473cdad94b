//! The C signature of each entry point of the table, derived from the Rust
//! function types themselves, for the ABI test against nccl.h: a return
//! code and argument codes, `i` int (and NCCL's int-sized enums), `u`
//! unsigned int, `z` size_t, `p` any pointer or handle, `id` ncclUniqueId
//! by value.

use super::*;

pub trait Arg {
    const CODE: &'static str;
}
impl Arg for c_int {
    const CODE: &'static str = "i";
}
impl Arg for c_uint {
    const CODE: &'static str = "u";
}
impl Arg for usize {
    const CODE: &'static str = "z";
}
impl<T> Arg for *mut T {
    const CODE: &'static str = "p";
}
impl<T> Arg for *const T {
    const CODE: &'static str = "p";
}
impl Arg for UniqueId {
    const CODE: &'static str = "id";
}

pub trait Signature {
    fn signature() -> String;
}
macro_rules! signature {
    ($($a:ident),*) => {
        impl<R: Arg, $($a: Arg),*> Signature for unsafe extern "C" fn($($a),*) -> R {
            fn signature() -> String {
                let args: &[&str] = &[$($a::CODE),*];
                format!("{}({})", R::CODE, args.join(","))
            }
        }
    };
}
signature!();
signature!(A);
signature!(A, B);
signature!(A, B, C);
signature!(A, B, C, D);
signature!(A, B, C, D, E);
signature!(A, B, C, D, E, F);
signature!(A, B, C, D, E, F, G);
signature!(A, B, C, D, E, F, G, H);
signature!(A, B, C, D, E, F, G, H, I);
signature!(A, B, C, D, E, F, G, H, I, J);
signature!(A, B, C, D, E, F, G, H, I, J, K);

fn sig<T: Signature>() -> String {
    T::signature()
}

/// Every symbol [`Nccl::from_handle`] resolves, with the Rust type it is
/// called through and whether the table requires it.
pub fn table() -> Vec<(&'static str, String, bool)> {
    vec![
        ("ncclGetVersion", sig::<FnGetVersion>(), true),
        ("ncclGetUniqueId", sig::<FnGetUniqueId>(), true),
        ("ncclCommInitRankConfig", sig::<FnInitRankConfig>(), true),
        ("ncclCommFinalize", sig::<FnComm>(), true),
        ("ncclCommDestroy", sig::<FnComm>(), true),
        ("ncclCommAbort", sig::<FnComm>(), true),
        ("ncclCommGetAsyncError", sig::<FnAsyncError>(), true),
        ("ncclCommCount", sig::<FnCommInt>(), true),
        ("ncclCommUserRank", sig::<FnCommInt>(), true),
        ("ncclGetErrorString", sig::<FnErrorString>(), true),
        ("ncclGetLastError", sig::<FnLastError>(), false),
        ("ncclCommSplit", sig::<FnSplit>(), false),
        ("ncclCommShrink", sig::<FnShrink>(), false),
        ("ncclCommRevoke", sig::<FnRevoke>(), false),
        ("ncclRedOpCreatePreMulSum", sig::<FnPreMulSum>(), false),
        ("ncclRedOpDestroy", sig::<FnRedOpDestroy>(), false),
        ("ncclReduce", sig::<FnReduce>(), true),
        ("ncclBroadcast", sig::<FnBroadcast>(), true),
        ("ncclAllReduce", sig::<FnAllReduce>(), true),
        ("ncclReduceScatter", sig::<FnAllReduce>(), true),
        ("ncclAllGather", sig::<FnAllGather>(), true),
        ("ncclSend", sig::<FnSendRecv>(), true),
        ("ncclRecv", sig::<FnSendRecv>(), true),
        ("ncclGroupStart", sig::<FnGroup>(), true),
        ("ncclGroupEnd", sig::<FnGroup>(), true),
        ("ncclAlltoAll", sig::<FnAllGather>(), false),
        ("ncclCommRegister", sig::<FnRegister>(), false),
        ("ncclCommDeregister", sig::<FnDeregister>(), false),
        ("ncclMemAlloc", sig::<FnMemAlloc>(), false),
        ("ncclMemFree", sig::<FnMemFree>(), false),
        ("ncclGather", sig::<FnBroadcast>(), false),
        ("ncclScatter", sig::<FnBroadcast>(), false),
        ("ncclCommWindowRegister", sig::<FnWindowRegister>(), false),
        (
            "ncclCommWindowDeregister",
            sig::<FnWindowDeregister>(),
            false,
        ),
        ("ncclPutSignal", sig::<FnPutSignal>(), false),
        ("ncclSignal", sig::<FnSignal>(), false),
        ("ncclWaitSignal", sig::<FnWaitSignal>(), false),
        ("ncclCommInitAll", sig::<FnInitAll>(), false),
    ]
}

/// The same code for a C type as written in nccl.h (parameter name, if
/// any, already removed); None for a type this mapping does not know.
fn c_type_code(ty: &str) -> Option<&'static str> {
    if ty.contains('*') {
        return Some("p");
    }
    let words: Vec<&str> = ty.split_whitespace().filter(|w| *w != "const").collect();
    Some(match words.join(" ").as_str() {
        "int" | "ncclResult_t" | "ncclDataType_t" | "ncclRedOp_t" | "ncclScalarResidence_t" => "i",
        "unsigned int" | "unsigned" => "u",
        "size_t" => "z",
        "ncclComm_t" | "cudaStream_t" | "ncclWindow_t" => "p",
        "ncclUniqueId" => "id",
        _ => return None,
    })
}

/// The prototype of `name` in nccl.h's text, as the same codes
/// ("i(p,z,i)"), or None where the header does not declare it. A
/// prototype is a line starting with its return type, the name preceded
/// by blanks or `*` (so `pnccl...` profiling twins and mentions in
/// comments do not match), and `);` after the arguments.
pub fn c_signature(header: &str, name: &str) -> Option<std::result::Result<String, String>> {
    let pat = format!("{name}(");
    let mut from = 0;
    while let Some(i) = header[from..].find(&pat).map(|i| i + from) {
        from = i + pat.len();
        let before = header[..i].chars().next_back();
        if !matches!(before, Some(' ') | Some('\t') | Some('*')) {
            continue;
        }
        let line_start = header[..i].rfind('\n').map_or(0, |n| n + 1);
        let ret = header[line_start..i].trim();
        let Some(close) = header[from..].find(')').map(|c| c + from) else {
            continue;
        };
        if !header[close + 1..].trim_start().starts_with(';') {
            continue;
        }
        let ret_code = match ret
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .as_str()
        {
            "ncclResult_t" => "i",
            "const char*" | "const char *" => "p",
            _ => continue,
        };
        let args = header[from..close]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let mut codes = Vec::new();
        if !(args.is_empty() || args == "void") {
            for a in args.split(',') {
                let a = a.trim();
                // Drop the parameter name: the last word, unless the
                // parameter is a bare type ("void*", "int").
                let ty = match a.rfind([' ', '*']) {
                    Some(k) if !a[k + 1..].is_empty() && c_type_code(&a[k + 1..]).is_none() => {
                        &a[..=k]
                    }
                    _ => a,
                };
                match c_type_code(ty) {
                    Some(c) => codes.push(c),
                    None => return Some(Err(format!("{name}: unknown C type {ty:?} in ({args})"))),
                }
            }
        }
        return Some(Ok(format!("{ret_code}({})", codes.join(","))));
    }
    None
}
