//! `tc_comm_*` and the operations.
