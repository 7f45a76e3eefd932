//! The snapshot a node loads from its data directory at start
//! (`snapshot.bin`), and the exported state `fenced restore` reads: the
//! first byte picks which. Whatever loads holds every invariant of the
//! table, and its table's snapshot loads back to the same table.
#![no_main]

use fenced_core::{KvStore, TableSeed, DEFAULT_HISTORY_PER_RESOURCE};
use fenced_server::{codec, state_machine::inspect_export, testing::fuzzing};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    if which & 1 == 1 {
        // Checked as a load checks it; refused or summarised, never a panic.
        let _ = inspect_export(bytes);
        return;
    }
    let Ok((_meta, table)) = fuzzing::snapshot_file(bytes, DEFAULT_HISTORY_PER_RESOURCE) else {
        return;
    };
    assert_eq!(table.check_invariants(), Ok(()));
    assert_eq!(table.kv().check_invariants(), Ok(()));
    let snapshot = table.snapshot();
    let again = match codec::encode("table", &snapshot) {
        Ok(again) => again,
        Err(e) => panic!("a loaded table's snapshot does not encode: {e}"),
    };
    let seed = TableSeed {
        history_len: DEFAULT_HISTORY_PER_RESOURCE,
    };
    match codec::decode_seed("table", &again, seed) {
        Ok(reloaded) => assert_eq!(reloaded.snapshot(), snapshot),
        Err(e) => panic!("a loaded table's snapshot does not load again: {e}"),
    }
    // The fenced store, kept apart from the table's snapshot, likewise.
    let kv = table.kv_snapshot();
    match KvStore::from_snapshot(kv.clone()) {
        Ok(reloaded) => assert_eq!(reloaded.snapshot(), kv),
        Err(e) => panic!("a loaded store's snapshot does not load again: {e}"),
    }
});
