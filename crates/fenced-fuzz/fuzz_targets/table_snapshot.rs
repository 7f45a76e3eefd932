//! A lease table snapshot's bytes (the table part of every snapshot a node
//! loads or receives), in the node's codec: built as it is decoded
//! (`TableSeed`, as a node loads it) and decoded whole then loaded
//! (`LeaseTable::from_snapshot_with_history`). Both give the same verdict
//! and the same table, whose invariants hold and whose own snapshot loads
//! back to it.
#![no_main]

use fenced_core::{LeaseTable, TableSeed, TableSnapshot, DEFAULT_HISTORY_PER_RESOURCE};
use fenced_server::codec;
use libfuzzer_sys::fuzz_target;

const SEED: TableSeed = TableSeed {
    history_len: DEFAULT_HISTORY_PER_RESOURCE,
};

fuzz_target!(|data: &[u8]| {
    let streamed = codec::decode_seed("table", data, SEED);
    let whole = codec::decode::<TableSnapshot>("table", data)
        .map_err(|e| e.to_string())
        .and_then(|s| {
            LeaseTable::from_snapshot_with_history(s, DEFAULT_HISTORY_PER_RESOURCE)
                .map_err(|e| e.to_string())
        });
    match (streamed, whole) {
        (Ok(streamed), Ok(whole)) => {
            assert_eq!(streamed.check_invariants(), Ok(()));
            assert_eq!(whole.check_invariants(), Ok(()));
            let snapshot = streamed.snapshot();
            assert_eq!(snapshot, whole.snapshot());
            reloads(&snapshot);
        }
        (Err(_), Err(_)) => {}
        (Ok(_), Err(e)) => panic!("loaded as it was decoded, refused whole: {e}"),
        (Err(e), Ok(_)) => panic!("loaded whole, refused as it was decoded: {e}"),
    }
});

/// A loaded table's snapshot, encoded, loads to the same snapshot.
fn reloads(snapshot: &TableSnapshot) {
    let bytes = match codec::encode("table", snapshot) {
        Ok(bytes) => bytes,
        Err(e) => panic!("a loaded table's snapshot does not encode: {e}"),
    };
    match codec::decode_seed("table", &bytes, SEED) {
        Ok(table) => assert_eq!(&table.snapshot(), snapshot),
        Err(e) => panic!("a loaded table's snapshot does not load again: {e}"),
    }
}
