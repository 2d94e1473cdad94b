//! The sweep: every dtype, reduce op and size of the command line, each
//! measured out of place and in place where the operation has that form.

use crate::bench::Bench;
use crate::case::{Case, Ranks};
use crate::coll::Coll;
use crate::die;
use crate::options::Args;
use crate::table::{Cell, Row};
use std::fs::File;
use torchcomm::{DType, RedKind};

/// What the summary lines report, over the whole sweep.
#[derive(Default)]
pub(crate) struct Totals {
    pub(crate) busbw_sum: f64,
    pub(crate) busbw_count: usize,
    pub(crate) wrong: u64,
}

/// The sizes in bytes from -b to -e, multiplied by -f (the last one -e);
/// one size 0 for the barrier.
fn sizes(args: &Args) -> Vec<usize> {
    let mut sizes = Vec::new();
    if args.coll == Coll::Barrier {
        sizes.push(0);
        return sizes;
    }
    let mut s = args.min_bytes;
    loop {
        sizes.push(s);
        if s >= args.max_bytes {
            break;
        }
        s = s.saturating_mul(args.factor).min(args.max_bytes);
    }
    sizes
}

/// Runs the whole sweep; rank 0 prints one row per size (and writes the
/// CSV lines).
pub(crate) fn run(
    bench: &mut Bench,
    rank: usize,
    label: &str,
    mut csv: Option<&mut File>,
) -> Totals {
    let coll = bench.args.coll;
    let redops: Vec<RedKind> = if coll.reduces() {
        bench.args.redops.clone()
    } else {
        vec![RedKind::Sum]
    };
    let dtypes: Vec<DType> = if coll == Coll::Barrier {
        vec![DType::U8]
    } else {
        bench.args.dtypes.clone()
    };
    let sizes = sizes(&bench.args);
    let mut totals = Totals::default();
    for &dt in &dtypes {
        for &red in &redops {
            // Sizes that round to the same element count are measured once.
            let mut last_bytes = usize::MAX;
            for &size in &sizes {
                let Some(row) = row(bench, label, dt, red, size) else {
                    continue;
                };
                if row.bytes == last_bytes {
                    continue;
                }
                last_bytes = row.bytes;
                let mut line = row.start();
                for in_place in [false, true] {
                    let cell = measure_cell(bench, &row, rank, dt, red, in_place);
                    match cell {
                        None => Row::push_unsupported(&mut line),
                        Some(c) => {
                            if coll != Coll::Barrier {
                                totals.busbw_sum += c.busbw;
                                totals.busbw_count += 1;
                            }
                            totals.wrong += c.wrong.unwrap_or(0);
                            Row::push_cell(&mut line, &c);
                            if let Some(f) = csv.as_deref_mut() {
                                row.write_csv(f, &c);
                            }
                        }
                    }
                }
                if rank == 0 {
                    println!("{line}");
                }
            }
        }
    }
    totals
}

/// The row of `size` bytes of `dt`: None when not even one element fits.
fn row<'a>(bench: &Bench, label: &'a str, dt: DType, red: RedKind, size: usize) -> Option<Row<'a>> {
    let (coll, n) = (bench.args.coll, bench.n);
    let es = dt.size();
    let per = if coll.size_is_total() { es * n } else { es };
    let count = size / per;
    if coll != Coll::Barrier && count == 0 {
        return None;
    }
    Some(Row {
        label,
        coll,
        n,
        count,
        bytes: count * per,
        total_count: if coll.size_is_total() {
            count * n
        } else {
            count
        },
        type_name: if coll == Coll::Barrier {
            "none"
        } else {
            dt.name()
        },
        redname: if coll.reduces() { red.name() } else { "none" },
        root: if coll.rooted() {
            bench.args.root.to_string()
        } else {
            "-1".into()
        },
    })
}

/// Measures one placement of a row; None when the operation has no such
/// form.
fn measure_cell(
    bench: &mut Bench,
    row: &Row,
    rank: usize,
    dt: DType,
    red: RedKind,
    in_place: bool,
) -> Option<Cell> {
    let coll = row.coll;
    let supported = if coll == Coll::Barrier {
        !in_place
    } else if in_place {
        coll.has_in_place()
    } else {
        coll.has_out_of_place()
    };
    if !supported {
        return None;
    }
    let ranks = Ranks {
        rank,
        n: row.n,
        root: bench.args.root as usize,
    };
    let mut case = Case::new(coll, dt, red, in_place, ranks, row.count);
    if let Some(g) = &bench.gpu {
        case = case
            .on_device(&g.device)
            .unwrap_or_else(|e| die("allocating device buffers", e));
    }
    let fig = bench.measure(&mut case);
    let algbw = row.bytes as f64 / (fig.time * 1e-6) / 1e9;
    Some(Cell {
        in_place,
        us: fig.time,
        algbw,
        busbw: algbw * coll.bus_factor(row.n),
        wrong: fig.wrong,
        host: fig.host,
        device: fig.device,
    })
}
