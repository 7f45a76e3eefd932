//! Checks of the crate itself, and the decoders' entry points for the fuzz
//! targets: nothing else in the crate imports this folder.

#[cfg(test)]
mod decoder_props;
#[doc(hidden)]
pub mod fuzzing;
#[cfg(test)]
mod module_graph;
#[cfg(test)]
mod openraft_contract;
