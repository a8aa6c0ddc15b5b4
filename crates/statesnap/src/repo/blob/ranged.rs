//! BLAKE3 over ranges: the range size, and the merge of the ranges'
//! subtree hashes into the blob's hash.

use blake3::hazmat::{ChainingValue, Mode, merge_subtrees_non_root, merge_subtrees_root};

use crate::repo::paths::BlobHash;

/// `size` rounded down to a power of two of at least one BLAKE3 chunk
/// (1 KiB): every range but the last is then a whole, aligned subtree.
pub(super) fn part_size(size: usize) -> u64 {
    let size = (size as u64).max(blake3::CHUNK_LEN as u64);
    1 << (63 - size.leading_zeros())
}

/// The hash of a blob from the chaining values of its ranges, in order:
/// all but the last a full range of one power-of-two size, the last of
/// any non-zero length up to it. `None` for fewer than two ranges (a
/// single range is the root itself: hash it as a whole).
pub(super) fn merge(cvs: &[ChainingValue]) -> Option<BlobHash> {
    let (last, full) = cvs.split_last()?;
    if full.is_empty() {
        return None;
    }
    // As BLAKE3's own hasher does: whole subtrees on a stack, two of
    // equal size merged as soon as a third range follows them (here:
    // always, since the last range comes after every full one).
    let mut stack: Vec<ChainingValue> = Vec::new();
    for (i, cv) in full.iter().enumerate() {
        stack.push(*cv);
        let mut done = i + 1;
        while done % 2 == 0 {
            let right = stack.pop()?;
            let left = stack.pop()?;
            stack.push(merge_subtrees_non_root(&left, &right, Mode::Hash));
            done /= 2;
        }
    }
    // Then from the right: the last range joins the smallest subtree,
    // that the next, and the largest makes the root.
    let mut right = *last;
    while let Some(left) = stack.pop() {
        if stack.is_empty() {
            return Some(BlobHash::from(merge_subtrees_root(
                &left,
                &right,
                Mode::Hash,
            )));
        }
        right = merge_subtrees_non_root(&left, &right, Mode::Hash);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use blake3::hazmat::HasherExt;

    fn by_ranges(data: &[u8], part: u64) -> Option<BlobHash> {
        let cvs: Vec<ChainingValue> = data
            .chunks(part as usize)
            .enumerate()
            .map(|(i, c)| {
                blake3::Hasher::new()
                    .set_input_offset(i as u64 * part)
                    .update(c)
                    .finalize_non_root()
            })
            .collect();
        merge(&cvs)
    }

    /// Every length from two ranges up, around every boundary that
    /// changes the tree's shape, for several range sizes.
    #[test]
    fn merged_range_hashes_equal_the_whole_hash() {
        let data: Vec<u8> = (0..(80u32 << 10))
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        for part in [1024u64, 2048, 4096, 8192] {
            let mut lens: Vec<u64> = (1..=9u64)
                .flat_map(|n| [n * part - 1, n * part, n * part + 1, n * part + 700])
                .filter(|l| *l > part)
                .collect();
            lens.extend([part + 1, 2 * part, 4 * part + 1023, 80 << 10]);
            for len in lens {
                let d = &data[..len as usize];
                assert_eq!(
                    by_ranges(d, part),
                    Some(BlobHash::from(blake3::hash(d))),
                    "part={part} len={len}"
                );
            }
        }
    }

    #[test]
    fn one_range_is_refused_and_sizes_round_down_to_powers_of_two() {
        let cv = blake3::Hasher::new().update(b"x").finalize_non_root();
        assert_eq!(merge(&[cv]), None);
        assert_eq!(merge(&[]), None);
        assert_eq!(part_size(16 << 20), 16 << 20);
        assert_eq!(part_size((16 << 20) + 5), 16 << 20);
        assert_eq!(part_size(3000), 2048);
        assert_eq!(part_size(1), 1024);
    }
}
