//! One sorted stream out of the sources' sorted iterators.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};
use crate::store::{KeyValue, KvIter};

/// Merges `N` iterators that are each in ascending key order into one
/// ascending stream of `(source index, key, value)`. Memory: one entry per
/// source. A key held by two sources is an error (`config`) naming both:
/// the sources were not partitioned by key, so no placement is exact.
pub(crate) struct Merge<'a> {
    sources: Vec<KvIter<'a>>,
    heads: BinaryHeap<Reverse<Head>>,
    last: Option<(bytes::Bytes, usize)>,
    names: Vec<String>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Head {
    key: bytes::Bytes,
    source: usize,
    value: bytes::Bytes,
}

impl<'a> Merge<'a> {
    /// `names[i]` names source `i` in errors.
    pub(crate) fn new(sources: Vec<KvIter<'a>>, names: Vec<String>) -> Result<Self> {
        let mut m = Merge {
            heads: BinaryHeap::with_capacity(sources.len()),
            sources,
            last: None,
            names,
        };
        for i in 0..m.sources.len() {
            m.advance(i)?;
        }
        Ok(m)
    }

    fn advance(&mut self, source: usize) -> Result<()> {
        if let Some(kv) = self.sources[source].next() {
            let (key, value) = kv?;
            self.heads.push(Reverse(Head { key, source, value }));
        }
        Ok(())
    }

    /// The next entry in key order, with the index of its source.
    pub(crate) fn next_entry(&mut self) -> Result<Option<(usize, KeyValue)>> {
        let Some(Reverse(head)) = self.heads.pop() else {
            return Ok(None);
        };
        self.advance(head.source)?;
        if let Some((last, from)) = &self.last
            && *last >= head.key
        {
            let what = if *last == head.key {
                format!(
                    "the key is held by two source partitions key={:?} sources=`{}`,`{}`; \
                         the sources were not partitioned by key, so no placement is exact",
                    String::from_utf8_lossy(&head.key),
                    self.names[*from],
                    self.names[head.source]
                )
            } else {
                format!(
                    "a source store iterated out of key order source=`{}`; its store \
                         implementation breaks the StateStore contract",
                    self.names[head.source]
                )
            };
            return Err(Error::config(what));
        }
        self.last = Some((head.key.clone(), head.source));
        Ok(Some((head.source, (head.key, head.value))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use bytes::Bytes;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn iter(keys: Vec<Vec<u8>>) -> KvIter<'static> {
        Box::new(
            keys.into_iter()
                .map(|k| Ok((Bytes::from(k.clone()), Bytes::from(k)))),
        )
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("s{i}")).collect()
    }

    proptest! {
        /// The merge of key-disjoint sorted runs is their sorted union,
        /// each entry tagged with the run it came from.
        #[test]
        fn merges_disjoint_runs_in_order(
            keys in proptest::collection::btree_map(
                proptest::collection::vec(any::<u8>(), 0..6), 0..5usize, 0..200),
        ) {
            let mut runs: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 5];
            for (k, s) in &keys {
                runs[*s].push(k.clone());
            }
            let mut m = Merge::new(runs.into_iter().map(iter).collect(), names(5)).unwrap();
            let mut got = BTreeMap::new();
            let mut order = Vec::new();
            while let Some((s, (k, v))) = m.next_entry().unwrap() {
                prop_assert_eq!(&k, &v);
                order.push(k.to_vec());
                got.insert(k.to_vec(), s);
            }
            prop_assert!(order.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(got, keys);
        }
    }

    #[test]
    fn a_key_in_two_sources_is_refused_naming_both() {
        let a = iter(vec![b"a".to_vec(), b"k".to_vec()]);
        let b = iter(vec![b"b".to_vec(), b"k".to_vec()]);
        let mut m = Merge::new(vec![a, b], names(2)).unwrap();
        let e = loop {
            match m.next_entry() {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the duplicate went through"),
                Err(e) => break e,
            }
        };
        assert_eq!(e.kind(), ErrorKind::Config);
    }

    #[test]
    fn a_source_out_of_order_is_refused() {
        let a = iter(vec![b"b".to_vec(), b"a".to_vec()]);
        let mut m = Merge::new(vec![a], names(1)).unwrap();
        assert!(m.next_entry().unwrap().is_some());
        assert_eq!(m.next_entry().unwrap_err().kind(), ErrorKind::Config);
    }
}
