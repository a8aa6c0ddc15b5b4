//! Warm standbys for a consumer group: a member follows the stores of
//! partitions other members own ([`GroupContext::set_standbys`]), and when
//! the group assigns it one of them the standby is promoted — the lag
//! replayed, nothing downloaded — instead of the store being restored.
//!
//! Which member follows which partition is the application's choice;
//! [`place_standbys`] is a deterministic one: every member computes the
//! same placement from the same view of who owns what.

use std::collections::{BTreeMap, BTreeSet};

use super::{GroupContext, PartitionStores, lock};
use crate::error::Error;
use crate::runtime::{StandbyHandle, StandbyStatus, StateHandle, StoreSpec};

/// The standbys of a group: for each member (by a stable, unique name),
/// the partitions it should follow. `owners` maps each live member to
/// the partitions it owns. The members are put in name order; each
/// partition is followed by the first member after its owner in that
/// order (wrapping around) that does not claim it too. So every owned
/// partition gets exactly one standby, never on a member that claims it —
/// none when every member claims it (a group of one). A partition two
/// members claim (a view caught mid-rebalance) counts as the first one's
/// in name order. The same `owners` gives the same placement on every
/// member.
pub fn place_standbys<P: Ord + Clone>(
    owners: &BTreeMap<String, BTreeSet<P>>,
) -> BTreeMap<String, BTreeSet<P>> {
    let names: Vec<&String> = owners.keys().collect();
    let mut placed: BTreeMap<String, BTreeSet<P>> = names
        .iter()
        .map(|n| ((*n).clone(), BTreeSet::new()))
        .collect();
    // Each partition once, with its first claimant in name order.
    let mut first_owner: BTreeMap<&P, usize> = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        for p in &owners[*name] {
            first_owner.entry(p).or_insert(i);
        }
    }
    for (p, owner) in first_owner {
        let follower = (1..names.len())
            .map(|step| names[(owner + step) % names.len()])
            .find(|n| !owners[*n].contains(p));
        if let Some(n) = follower
            && let Some(set) = placed.get_mut(n)
        {
            set.insert(p.clone());
        }
    }
    placed
}

impl<S: PartitionStores> GroupContext<S> {
    /// Makes this member follow exactly `wanted` (input topic and
    /// partition pairs) as standbys, except partitions it owns: standbys no
    /// longer wanted are stopped (their local stores stay, for a later
    /// standby or open), new ones are started (they bootstrap in the
    /// background, from the local store if it is still valid, else the
    /// newest snapshot). Call it when the placement may have changed —
    /// after a rebalance, when other members come or go; it does nothing
    /// for standbys already running. Returns the errors of standbys that
    /// could not be started (their spec or directory); the others start.
    pub fn set_standbys(&self, wanted: impl IntoIterator<Item = (String, i32)>) -> Vec<Error> {
        let owned: BTreeSet<(String, i32)> = self.assigned().into_iter().collect();
        let wanted: BTreeSet<(String, i32)> =
            wanted.into_iter().filter(|k| !owned.contains(k)).collect();
        let mut errors = Vec::new();
        let mut standbys = lock(&self.standbys);
        standbys.retain(|k, _| wanted.contains(k));
        for (topic, partition) in wanted {
            if standbys.contains_key(&(topic.clone(), partition)) {
                continue;
            }
            match self
                .stores
                .spec(&topic, partition)
                .and_then(|spec| self.manager.standby(spec))
            {
                Ok(sb) => {
                    tracing::info!(topic, partition, "standby started");
                    standbys.insert((topic, partition), sb);
                }
                Err(e) => {
                    tracing::warn!(topic, partition, error = %e, "standby could not be started");
                    errors.push(e);
                }
            }
        }
        errors
    }

    /// The status of every standby this member runs.
    pub fn standbys(&self) -> Vec<((String, i32), StandbyStatus)> {
        lock(&self.standbys)
            .iter()
            .map(|(k, sb)| (k.clone(), sb.status()))
            .collect()
    }

    pub(super) fn take_standby(
        &self,
        topic: &str,
        partition: i32,
    ) -> Option<StandbyHandle<S::Format, S::Changelog>> {
        lock(&self.standbys).remove(&(topic.to_owned(), partition))
    }

    /// Promotes `standby` within the promotion deadline; on failure, the
    /// spec to open the store with instead (`None` if even that could not
    /// be had back: the caller makes a new one).
    pub(super) async fn promote(
        &self,
        standby: StandbyHandle<S::Format, S::Changelog>,
        topic: &str,
        partition: i32,
    ) -> std::result::Result<
        StateHandle<S::Format, S::Changelog>,
        Option<StoreSpec<S::Format, S::Changelog>>,
    > {
        match standby.promote(self.options.promote_deadline).await {
            Ok(handle) => Ok(handle),
            Err(failed) => {
                tracing::warn!(topic, partition, error = %failed.error, "standby not promoted; opening the store instead");
                match failed.standby.into_spec().await {
                    Ok(spec) => Err(Some(spec)),
                    Err(e) => {
                        tracing::warn!(topic, partition, error = %e, "standby's spec not recovered");
                        Err(None)
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(of: &[(&str, &[i32])]) -> BTreeMap<String, BTreeSet<i32>> {
        of.iter()
            .map(|(n, ps)| ((*n).to_owned(), ps.iter().copied().collect()))
            .collect()
    }

    #[test]
    fn each_partition_gets_one_standby_on_the_next_member() {
        let placed = place_standbys(&owners(&[("b", &[0, 2, 4]), ("a", &[1, 3]), ("c", &[5])]));
        let set = |v: &[i32]| v.iter().copied().collect::<BTreeSet<i32>>();
        // In name order a, b, c: a's go to b, b's to c, c's to a.
        assert_eq!(placed["b"], set(&[1, 3]));
        assert_eq!(placed["c"], set(&[0, 2, 4]));
        assert_eq!(placed["a"], set(&[5]));
        // Every partition once, never on its owner.
        let all: Vec<i32> = placed.values().flatten().copied().collect();
        assert_eq!(all.len(), 6);
        // One member: nobody to follow for it.
        assert!(place_standbys(&owners(&[("a", &[0, 1])]))["a"].is_empty());
        // A partition two members claim (a view caught mid-rebalance) gets
        // one standby, on neither of them.
        let placed = place_standbys(&owners(&[("a", &[1]), ("b", &[]), ("c", &[1]), ("d", &[])]));
        assert_eq!(placed["b"], set(&[1]));
        assert!(placed["a"].is_empty() && placed["c"].is_empty() && placed["d"].is_empty());
        // An owner's next member claims it too: the one after that follows.
        let placed = place_standbys(&owners(&[("a", &[0, 1]), ("b", &[1]), ("c", &[])]));
        assert_eq!(placed["b"], set(&[0]));
        assert_eq!(placed["c"], set(&[1]));
        assert!(placed["a"].is_empty());
    }
}
