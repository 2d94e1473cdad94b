//! Issue: one operation to the transport that serves it. The comm's
//! transport table (see [`super::routes`]) offers it to each transport in
//! turn; the first that carries it runs it.

use super::GlooBackend;
use crate::backends::transport::Call;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::util::Deadline;

impl GlooBackend {
    pub(super) fn execute(&self, op: &Op, d: &Deadline) -> Result<()> {
        if self.routes.tcp().checks_collectives() && !matches!(op, Op::Refused(_)) {
            self.on_tcp(|tcp| tcp.check_collective(op, d))?;
        }
        let alive = || self.check_not_broken();
        let out_of_step = |e: &Error| self.mark_broken(e);
        let call = Call {
            op,
            deadline: d,
            alive: &alive,
            out_of_step: &out_of_step,
        };
        // SAFETY: the comm validated every pointer against its count, and
        // the caller keeps the buffers alive until completion.
        unsafe { self.routes.run(&call) }
    }
}
