//! The [`StateStore`](crate::store::StateStore) suite. `make` must return a fresh, empty store each
//! time it is called.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::ops::Bound;

use crate::changelog::{ChangelogBinding, ChangelogId, Lineage, Record};
use crate::store::{StateStore, StateStoreExt, ensure_follows};

fn collect<S: StateStore + ?Sized>(
    s: &S,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
) -> Vec<(Bytes, Bytes)> {
    s.range(start, end)
        .expect("range")
        .map(|kv| kv.expect("range item"))
        .collect()
}

/// Runs every check.
pub fn run_all<S: StateStore>(make: &mut dyn FnMut() -> S) {
    let checks: [fn(&mut S); 12] = [
        empty_store,
        apply_put_get_delete,
        later_record_in_batch_wins,
        applied_offset_moves_with_batches,
        ranges_and_prefixes_are_ordered_and_bounded,
        binary_keys_sort_bytewise,
        empty_values_are_not_deletes,
        large_values_round_trip,
        size_estimate_tracks_contents,
        matches_model_on_random_batches,
        binding_is_recorded_once,
        ensure_follows_refuses_other_lineages,
    ];
    for check in checks {
        check(&mut make());
    }
}

fn binding(topic: &str, lineage: &str) -> ChangelogBinding {
    ChangelogBinding {
        changelog: ChangelogId::new(topic, 0).expect("topic"),
        lineage: Lineage(lineage.to_string()),
    }
}

/// A new store is unbound; `bind` records a binding, accepts the same one
/// again and refuses (`stale`) any other, whatever the store has applied.
pub fn binding_is_recorded_once<S: StateStore>(s: &mut S) {
    assert_eq!(s.binding().expect("binding"), None);
    let a = binding("app-s-changelog", "lineage-a");
    s.bind(&a).expect("bind");
    assert_eq!(s.binding().expect("binding"), Some(a.clone()));
    s.bind(&a)
        .expect("binding again to the same changelog is a no-op");
    s.apply(&[Record::put("k", "v")], 3).expect("apply");
    for other in [
        binding("app-s-changelog", "lineage-b"),
        binding("other-changelog", "lineage-a"),
    ] {
        let err = s.bind(&other).expect_err("rebinding must fail");
        assert_eq!(err.kind(), crate::ErrorKind::Stale, "{err}");
    }
    assert_eq!(s.binding().expect("binding"), Some(a));
    assert_eq!(s.applied_offset().expect("offset"), Some(3));
}

/// [`ensure_follows`] binds a fresh store, passes the same changelog, and
/// refuses a recreated changelog (new lineage) without touching the store.
pub fn ensure_follows_refuses_other_lineages<S: StateStore>(s: &mut S) {
    let a = binding("app-s-changelog", "lineage-a");
    ensure_follows(s, &a).expect("a fresh store is bound");
    assert_eq!(s.binding().expect("binding"), Some(a.clone()));
    s.apply(&[Record::put("k", "v")], 0).expect("apply");
    ensure_follows(s, &a).expect("same changelog");
    let err = ensure_follows(s, &binding("app-s-changelog", "lineage-b"))
        .expect_err("a recreated changelog must be refused");
    assert_eq!(err.kind(), crate::ErrorKind::Stale, "{err}");
    assert_eq!(err.reason(), Some(crate::Reason::OtherChangelog), "{err}");
    assert_eq!(s.get(b"k").expect("get").as_deref(), Some(&b"v"[..]));
}

/// A new store is empty and has applied nothing.
pub fn empty_store<S: StateStore>(s: &mut S) {
    assert_eq!(s.applied_offset().expect("applied_offset"), None);
    assert_eq!(s.get(b"missing").expect("get"), None);
    assert!(collect(s, Bound::Unbounded, Bound::Unbounded).is_empty());
}

/// Puts are readable, deletes remove, deleting a missing key is fine.
pub fn apply_put_get_delete<S: StateStore>(s: &mut S) {
    s.apply(&[Record::put("a", "1"), Record::put("b", "2")], 0)
        .expect("apply");
    assert_eq!(s.get(b"a").expect("get").as_deref(), Some(&b"1"[..]));
    s.apply(&[Record::delete("a"), Record::delete("never-there")], 1)
        .expect("apply");
    assert_eq!(s.get(b"a").expect("get"), None);
    assert_eq!(s.get(b"b").expect("get").as_deref(), Some(&b"2"[..]));
    s.apply(&[Record::put("b", "3")], 2).expect("apply");
    assert_eq!(s.get(b"b").expect("get").as_deref(), Some(&b"3"[..]));
}

/// Within one batch, the later record for a key wins.
pub fn later_record_in_batch_wins<S: StateStore>(s: &mut S) {
    s.apply(
        &[
            Record::put("k", "1"),
            Record::delete("k"),
            Record::put("k", "2"),
            Record::put("j", "x"),
            Record::delete("j"),
        ],
        10,
    )
    .expect("apply");
    assert_eq!(s.get(b"k").expect("get").as_deref(), Some(&b"2"[..]));
    assert_eq!(s.get(b"j").expect("get"), None);
}

/// `applied_offset` is exactly the offset given with the last batch,
/// including an empty batch.
pub fn applied_offset_moves_with_batches<S: StateStore>(s: &mut S) {
    s.apply(&[Record::put("a", "1")], 5).expect("apply");
    assert_eq!(s.applied_offset().expect("offset"), Some(5));
    s.apply(&[], 9).expect("apply empty");
    assert_eq!(s.applied_offset().expect("offset"), Some(9));
    s.apply(&[Record::put("a", "2")], 1_000_000_000_000)
        .expect("apply");
    assert_eq!(s.applied_offset().expect("offset"), Some(1_000_000_000_000));
}

/// Range bounds are honoured exactly; prefixes select exactly their keys.
pub fn ranges_and_prefixes_are_ordered_and_bounded<S: StateStore>(s: &mut S) {
    let keys = ["a", "ab", "abc", "abd", "b", "ba", "c"];
    let batch: Vec<_> = keys
        .iter()
        .rev()
        .map(|k| Record::put(*k, format!("v-{k}")))
        .collect();
    s.apply(&batch, 0).expect("apply");
    let ks = |v: Vec<(Bytes, Bytes)>| {
        v.into_iter()
            .map(|(k, _)| String::from_utf8(k.to_vec()).expect("utf8"))
            .collect::<Vec<_>>()
    };
    assert_eq!(ks(collect(s, Bound::Unbounded, Bound::Unbounded)), keys);
    assert_eq!(
        ks(collect(s, Bound::Included(b"ab"), Bound::Excluded(b"b"))),
        ["ab", "abc", "abd"]
    );
    assert_eq!(
        ks(collect(s, Bound::Excluded(b"ab"), Bound::Included(b"b"))),
        ["abc", "abd", "b"]
    );
    assert_eq!(
        ks(collect(s, Bound::Excluded(b"c"), Bound::Unbounded)),
        Vec::<String>::new()
    );
    assert_eq!(
        ks(collect(s, Bound::Included(b"b"), Bound::Excluded(b"a"))),
        Vec::<String>::new(),
        "inverted range is empty"
    );
    assert_eq!(
        ks(collect(s, Bound::Included(b"b"), Bound::Excluded(b"b"))),
        Vec::<String>::new()
    );
    let p: Vec<_> = s
        .prefix(b"ab")
        .expect("prefix")
        .map(|kv| kv.expect("item").0)
        .collect();
    assert_eq!(
        p,
        vec![Bytes::from("ab"), Bytes::from("abc"), Bytes::from("abd")]
    );
    let vals: Vec<_> = collect(s, Bound::Included(b"c"), Bound::Included(b"c"));
    assert_eq!(vals, vec![(Bytes::from("c"), Bytes::from("v-c"))]);
}

/// Keys compare as unsigned bytes, including 0x00 and 0xff.
pub fn binary_keys_sort_bytewise<S: StateStore>(s: &mut S) {
    let keys: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0, 0],
        vec![0x7f],
        vec![0x80],
        vec![0xff],
        vec![0xff, 0xff],
    ];
    let batch: Vec<_> = keys
        .iter()
        .rev()
        .map(|k| Record::put(k.clone(), vec![1u8]))
        .collect();
    s.apply(&batch, 0).expect("apply");
    let got: Vec<Vec<u8>> = collect(s, Bound::Unbounded, Bound::Unbounded)
        .into_iter()
        .map(|(k, _)| k.to_vec())
        .collect();
    assert_eq!(got, keys);
    let p: Vec<_> = s
        .prefix(&[0xff])
        .expect("prefix")
        .map(|kv| kv.expect("item").0.to_vec())
        .collect();
    assert_eq!(p, vec![vec![0xff], vec![0xff, 0xff]]);
}

/// An empty value is a value, not a delete.
pub fn empty_values_are_not_deletes<S: StateStore>(s: &mut S) {
    s.apply(&[Record::put("e", Bytes::new())], 0)
        .expect("apply");
    assert_eq!(s.get(b"e").expect("get"), Some(Bytes::new()));
    assert_eq!(collect(s, Bound::Unbounded, Bound::Unbounded).len(), 1);
}

/// Values of a few MiB round-trip.
pub fn large_values_round_trip<S: StateStore>(s: &mut S) {
    let big: Vec<u8> = (0..(3 << 20)).map(|i: u32| (i % 251) as u8).collect();
    s.apply(&[Record::put("big", big.clone())], 0)
        .expect("apply");
    assert_eq!(s.get(b"big").expect("get").as_deref(), Some(&big[..]));
}

/// The size estimate sees keys arrive (loosely: estimates may lag).
pub fn size_estimate_tracks_contents<S: StateStore>(s: &mut S) {
    let batch: Vec<_> = (0..1000u32)
        .map(|i| Record::put(format!("key-{i:05}"), vec![7u8; 100]))
        .collect();
    s.apply(&batch, 0).expect("apply");
    let est = s.approximate_size().expect("size");
    assert!(
        est.keys > 0 && est.bytes > 0,
        "size estimate stayed at zero: {est:?}"
    );
}

/// A deterministic pseudo-random workload matches a `BTreeMap` model.
pub fn matches_model_on_random_batches<S: StateStore>(s: &mut S) {
    let mut model: BTreeMap<Bytes, Bytes> = BTreeMap::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for batch_no in 0..50u64 {
        let n = (next() % 200) as usize;
        let mut batch = Vec::with_capacity(n);
        for _ in 0..n {
            let key = Bytes::from(format!("k{:03}", next() % 300));
            if next() % 4 == 0 {
                model.remove(&key);
                batch.push(Record::delete(key));
            } else {
                let v = Bytes::from(format!("v{}", next() % 1000));
                model.insert(key.clone(), v.clone());
                batch.push(Record {
                    key,
                    value: Some(v),
                });
            }
        }
        s.apply(&batch, batch_no).expect("apply");
    }
    let got: BTreeMap<Bytes, Bytes> = collect(s, Bound::Unbounded, Bound::Unbounded)
        .into_iter()
        .collect();
    assert_eq!(got, model, "store contents differ from model");
    for (k, v) in &model {
        assert_eq!(s.get(k).expect("get").as_ref(), Some(v));
    }
    let lo: &[u8] = b"k100";
    let hi: &[u8] = b"k200";
    let want: Vec<_> = model
        .range::<[u8], _>((Bound::Included(lo), Bound::Excluded(hi)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(collect(s, Bound::Included(lo), Bound::Excluded(hi)), want);
}
