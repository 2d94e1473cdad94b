//! What rank 0 prints and writes: the table's header lines, its rows (one
//! per size, out-of-place and in-place cells), the closing summary, and the
//! CSV lines of `--csv`.

use crate::coll::Coll;
use crate::options::Args;
use crate::sweep::Totals;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::process::exit;
use torchcomm::Device;

/// Opens the CSV file for appending, with the header line when it is new
/// (exit 2 when it cannot be opened).
pub(crate) fn open_csv(path: &str) -> File {
    let new = std::fs::metadata(path)
        .map(|m| m.len() == 0)
        .unwrap_or(true);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| {
            eprintln!("tc-perf: opening {path}: {e}");
            exit(2)
        });
    if new {
        writeln!(f, "system,op,nranks,size,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong,host_us,device_us")
            .unwrap();
    }
    f
}

/// How calls are issued and timed, for the first header line.
fn mode(args: &Args, device: Device, on_gpu: bool) -> String {
    match (on_gpu, args.async_op, args.blocking) {
        (false, false, _) => "blocking calls (async_op=0)".to_string(),
        (false, true, false) => "async_op=1, one wait after the loop".to_string(),
        (false, true, true) => "async_op=1, wait after each".to_string(),
        (true, a, z) => format!(
            "CUDA device {}, async_op={}{}{}, time = {}",
            match device {
                Device::Cuda(Some(i)) => i as i64,
                _ => -1,
            },
            a as u8,
            if z {
                ", stream synchronized after each call"
            } else {
                ""
            },
            if args.graphs > 0 {
                format!(", CUDA graph of the loop replayed {} times", args.graphs)
            } else {
                String::new()
            },
            if args.cpu_time {
                "host time issuing per call (-C)"
            } else {
                "device time per call (CUDA events)"
            }
        ),
    }
}

/// The table's header: the run's settings and the column names.
pub(crate) fn print_header(args: &Args, label: &str, n: usize, device: Device, on_gpu: bool) {
    let mode = mode(args, device, on_gpu);
    println!(
        "# tc-perf: {} on backend {} ({}), {} ranks, iters {}, warm-up {}, check {}, {}{}",
        args.coll.name(),
        args.backend,
        label,
        n,
        args.iters,
        args.warmup,
        args.check as u8,
        mode,
        if args.cpu_time && device == Device::Cpu {
            ", time = host time issuing (-C)"
        } else {
            ""
        }
    );
    println!("#");
    println!(
        "# {:>10} {:>12} {:>9} {:>6} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
        "", "", "", "", "", "out-of-place", "", "", "", "in-place", "", "", ""
    );
    println!(
        "# {:>10} {:>12} {:>9} {:>6} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    println!(
        "# {:>10} {:>12} {:>9} {:>6} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
}

/// The cells of one row that do not depend on the placement.
pub(crate) struct Row<'a> {
    pub(crate) label: &'a str,
    pub(crate) coll: Coll,
    pub(crate) n: usize,
    /// Elements each rank contributes (per block for the total-size ops).
    pub(crate) count: usize,
    pub(crate) bytes: usize,
    pub(crate) total_count: usize,
    pub(crate) type_name: &'static str,
    pub(crate) redname: &'static str,
    pub(crate) root: String,
}

/// One placement's measurement, as printed.
pub(crate) struct Cell {
    pub(crate) in_place: bool,
    pub(crate) us: f64,
    pub(crate) algbw: f64,
    pub(crate) busbw: f64,
    pub(crate) wrong: Option<u64>,
    pub(crate) host: f64,
    pub(crate) device: Option<f64>,
}

impl Row<'_> {
    /// The row's start: size, count, type, reduce op and root.
    pub(crate) fn start(&self) -> String {
        let mut line = String::new();
        let _ = write!(
            line,
            "  {:>10} {:>12} {:>9} {:>6} {:>5}",
            self.bytes, self.total_count, self.type_name, self.redname, self.root
        );
        line
    }

    /// The cells of a placement the operation does not have.
    pub(crate) fn push_unsupported(line: &mut String) {
        let _ = write!(
            line,
            "   {:>9} {:>7} {:>7} {:>6}",
            "N/A", "N/A", "N/A", "N/A"
        );
    }

    /// A placement's cells: time, bandwidths, wrong elements.
    pub(crate) fn push_cell(line: &mut String, c: &Cell) {
        let wrong_s = c.wrong.map_or("N/A".to_string(), |w| w.to_string());
        let _ = write!(
            line,
            "   {:>9.2} {:>7.3} {:>7.3} {:>6}",
            c.us, c.algbw, c.busbw, wrong_s
        );
    }

    /// One CSV line for a placement (exit 1 when it cannot be written).
    pub(crate) fn write_csv(&self, f: &mut File, c: &Cell) {
        let (label, n, bytes, total_count) = (self.label, self.n, self.bytes, self.total_count);
        let (type_name, redname, root) = (self.type_name, self.redname, &self.root);
        let (us, algbw, busbw) = (c.us, c.algbw, c.busbw);
        writeln!(
            f,
            "{label},{},{n},{bytes},{total_count},{type_name},{redname},{root},{},{us:.3},{algbw:.6},{busbw:.6},{},{:.3},{}",
            self.coll.name(),
            if c.in_place { "in-place" } else { "out-of-place" },
            c.wrong.map_or(-1i64, |w| w as i64),
            c.host,
            c.device.map_or(String::new(), |d| format!("{d:.3}"))
        )
        .unwrap_or_else(|e| {
            eprintln!("tc-perf: writing the CSV: {e}");
            exit(1)
        });
    }
}

/// The closing lines: wrong elements over the sweep and the mean bus
/// bandwidth.
pub(crate) fn print_summary(t: &Totals) {
    let wrong_total = t.wrong;
    println!(
        "# Out of bounds values : {wrong_total} {}",
        if wrong_total == 0 { "OK" } else { "FAILED" }
    );
    if t.busbw_count > 0 {
        println!(
            "# Avg bus bandwidth    : {:.6} ",
            t.busbw_sum / t.busbw_count as f64
        );
    }
    println!("#");
    let _ = std::io::stdout().flush();
}
