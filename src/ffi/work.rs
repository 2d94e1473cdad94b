//! `tc_work_*`.
