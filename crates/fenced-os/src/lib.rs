//! What fenced's processes ask of the operating system, written once: the
//! signal that asks a process to stop, and a file replaced atomically.
//! Every binary of the workspace uses these (`fenced`, `fencectl`,
//! `fenced-resource`, `fenced-gateway`, `fenced-outbox`, `fenced-bench`).

mod file;
mod stop;

pub use file::write_atomically;
pub use stop::stop_signal;
