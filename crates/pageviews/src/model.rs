//! The application's logic, free of Kafka and statesnap: page-view events,
//! the per-user state they fold into, the output each one produces, and a
//! single-process model that says what the distributed run must end with.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Views more than this far apart (event time) are in different sessions.
pub const SESSION_GAP_MS: i64 = 30 * 60 * 1000;

/// One page view: the input topic's value, keyed by `user`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Who viewed.
    pub user: String,
    /// What.
    pub page: String,
    /// When (event time, milliseconds).
    pub ts_ms: i64,
}

/// What the app keeps per user (the state store's value).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UserState {
    /// Views so far.
    pub views: u64,
    /// Latest event time seen.
    pub last_seen_ms: i64,
    /// Sessions so far (a gap over [`SESSION_GAP_MS`] starts a new one).
    pub sessions: u64,
    /// Start of the current session.
    pub session_start_ms: i64,
    /// Views in the current session.
    pub session_views: u64,
    /// The input generation of the record that last changed this state
    /// (see [`Position`]).
    #[serde(default)]
    pub generation: u32,
    /// The input offset that last changed this state: a record at or below
    /// it (in the same generation) is already applied (it is delivered again
    /// after a crash).
    pub last_offset: i64,
}

/// Where an input record stands: its offset within the input topic of one
/// generation. Each change of the partition count (a reshard) moves the
/// app to a new input topic whose offsets start again at 0, and bumps the
/// generation, so a position of a newer generation is always ahead of any
/// position of an older one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// The input generation (0 before any reshard).
    pub generation: u32,
    /// The offset in that generation's input partition.
    pub offset: i64,
}

impl UserState {
    /// Whether the record at `at` is already folded into this state.
    pub fn covers(&self, at: Position) -> bool {
        Position {
            generation: self.generation,
            offset: self.last_offset,
        } >= at
    }
}

/// The output record of one input record (output topic value, keyed by
/// user). `(partition, offset)` identifies it: a record delivered again
/// after a crash produces an identical output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// The user.
    pub user: String,
    /// Input partition.
    pub partition: i32,
    /// Input offset.
    pub offset: i64,
    /// Views so far.
    pub views: u64,
    /// Sessions so far.
    pub sessions: u64,
    /// Views in the current session.
    pub session_views: u64,
}

/// The store key of `user`'s state.
pub fn state_key(user: &str) -> Vec<u8> {
    format!("user/{user}").into_bytes()
}

/// Folds `event` (the input record at `at`) into the user's state.
pub fn apply(prev: Option<&UserState>, event: &Event, at: Position) -> UserState {
    let Position { generation, offset } = at;
    match prev {
        None => UserState {
            views: 1,
            last_seen_ms: event.ts_ms,
            sessions: 1,
            session_start_ms: event.ts_ms,
            session_views: 1,
            generation,
            last_offset: offset,
        },
        Some(s) => {
            let new_session = event.ts_ms.saturating_sub(s.last_seen_ms) > SESSION_GAP_MS;
            UserState {
                views: s.views + 1,
                last_seen_ms: s.last_seen_ms.max(event.ts_ms),
                sessions: s.sessions + u64::from(new_session),
                session_start_ms: if new_session {
                    event.ts_ms
                } else {
                    s.session_start_ms
                },
                session_views: if new_session { 1 } else { s.session_views + 1 },
                generation,
                last_offset: offset,
            }
        }
    }
}

/// The output for the state a record left.
pub fn output(user: &str, partition: i32, offset: i64, s: &UserState) -> Output {
    Output {
        user: user.to_owned(),
        partition,
        offset,
        views: s.views,
        sessions: s.sessions,
        session_views: s.session_views,
    }
}

/// The state and output a single process would end with.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Model {
    /// The input generation being fed.
    pub generation: u32,
    /// Per input partition, per user.
    pub states: BTreeMap<i32, BTreeMap<String, UserState>>,
    /// Per `(partition, offset)`, of the current generation's input.
    pub outputs: BTreeMap<(i32, i64), Output>,
    /// Input records that were not page-view events (skipped by the app).
    pub undecodable: u64,
}

impl Model {
    /// Feeds one input record; records of a partition in offset order.
    pub fn feed(&mut self, partition: i32, offset: i64, value: &[u8]) {
        let Ok(event) = serde_json::from_slice::<Event>(value) else {
            self.undecodable += 1;
            return;
        };
        let at = Position {
            generation: self.generation,
            offset,
        };
        let users = self.states.entry(partition).or_default();
        let next = apply(users.get(&event.user), &event, at);
        self.outputs.insert(
            (partition, offset),
            output(&event.user, partition, offset, &next),
        );
        users.insert(event.user, next);
    }

    /// The partition count changes to `partitions` (a reshard): each user's
    /// state moves to the partition a keyed producer sends that user's
    /// events to (Kafka's murmur2 of the user), the generation is bumped,
    /// and the outputs start again for the new generation's output topic.
    pub fn next_generation(&mut self, partitions: u32) {
        use statesnap::reshard::{Murmur2, Partitioner};
        let mut states: BTreeMap<i32, BTreeMap<String, UserState>> = BTreeMap::new();
        for (user, state) in std::mem::take(&mut self.states).into_values().flatten() {
            let p = Murmur2.partition(user.as_bytes(), partitions);
            states
                .entry(i32::try_from(p).unwrap_or(i32::MAX))
                .or_default()
                .insert(user, state);
        }
        self.states = states;
        self.outputs.clear();
        self.generation += 1;
    }
}

/// A deterministic stream of events `start..start + n` over `users` users:
/// one event per second of event time from `start_ms`, each for a random
/// user, so a user's gaps vary around `users` seconds (3 000 users: about
/// 50 minutes, some above the session gap and some below).
pub fn events(seed: u64, users: u64, start: u64, n: u64, start_ms: i64) -> Vec<Event> {
    (start..start + n)
        .map(|i| {
            let r = mix(seed ^ i);
            Event {
                user: format!("u{:07}", r % users.max(1)),
                page: format!("/page/{}", (r >> 32) % 50),
                ts_ms: start_ms.saturating_add((i as i64).saturating_mul(1_000)),
            }
        })
        .collect()
}

/// SplitMix64's finaliser: a well-spread hash of `x`.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(generation: u32, offset: i64) -> Position {
        Position { generation, offset }
    }

    #[test]
    fn a_newer_generation_is_ahead_of_any_older_offset() {
        let s = apply(None, &ev("a", 0), at(0, 900));
        assert!(s.covers(at(0, 900)) && s.covers(at(0, 3)));
        assert!(!s.covers(at(0, 901)));
        // After a reshard the new input starts at offset 0 again.
        assert!(!s.covers(at(1, 0)));
        let t = apply(Some(&s), &ev("a", 1), at(1, 0));
        assert!(t.covers(at(1, 0)) && t.covers(at(0, 5_000)));
        assert_eq!((t.views, t.generation, t.last_offset), (2, 1, 0));
    }

    #[test]
    fn the_next_generation_places_users_as_a_keyed_producer_does() {
        use statesnap::reshard::{Murmur2, Partitioner};
        let mut m = Model::default();
        for (i, e) in events(3, 200, 0, 2_000, 0).iter().enumerate() {
            let p = Murmur2.partition(e.user.as_bytes(), 6) as i32;
            m.feed(p, i as i64, &serde_json::to_vec(e).unwrap_or_default());
        }
        let users: BTreeMap<String, UserState> = m
            .states
            .values()
            .flatten()
            .map(|(u, s)| (u.clone(), s.clone()))
            .collect();
        m.next_generation(4);
        assert_eq!((m.generation, m.outputs.len()), (1, 0));
        let mut moved = 0;
        for (p, states) in &m.states {
            for (u, s) in states {
                assert_eq!(Murmur2.partition(u.as_bytes(), 4) as i32, *p);
                assert_eq!(users.get(u), Some(s));
                moved += 1;
            }
        }
        assert_eq!(moved, users.len());
    }

    fn ev(user: &str, ts_ms: i64) -> Event {
        Event {
            user: user.into(),
            page: "/".into(),
            ts_ms,
        }
    }

    #[test]
    fn sessions_split_on_the_gap_and_not_before() {
        let a = apply(None, &ev("a", 0), at(0, 0));
        let b = apply(Some(&a), &ev("a", SESSION_GAP_MS), at(0, 1));
        assert_eq!((b.sessions, b.session_views, b.views), (1, 2, 2));
        let c = apply(Some(&b), &ev("a", 2 * SESSION_GAP_MS + 1), at(0, 2));
        assert_eq!((c.sessions, c.session_views, c.views), (2, 1, 3));
        assert_eq!(c.session_start_ms, 2 * SESSION_GAP_MS + 1);
        // A late event stays in the current session and does not move time back.
        let d = apply(Some(&c), &ev("a", 10), at(0, 3));
        assert_eq!(
            (d.sessions, d.session_views, d.last_seen_ms),
            (2, 2, c.last_seen_ms)
        );
        assert_eq!(d.last_offset, 3);
    }

    #[test]
    fn model_skips_undecodable_records_and_keys_outputs_by_position() {
        let mut m = Model::default();
        let e = serde_json::to_vec(&ev("a", 5)).unwrap_or_default();
        m.feed(0, 0, &e);
        m.feed(0, 1, b"not json");
        m.feed(1, 0, &e);
        assert_eq!(m.undecodable, 1);
        assert_eq!(m.outputs.len(), 2);
        assert_eq!(m.states[&0]["a"].views, 1);
        assert_eq!(m.states[&1]["a"].views, 1);
    }

    #[test]
    fn events_are_deterministic_and_end_sessions() {
        let a = events(7, 3000, 0, 20_000, 0);
        assert_eq!(a, events(7, 3000, 0, 20_000, 0));
        assert_ne!(a, events(8, 3000, 0, 20_000, 0));
        let mut m = Model::default();
        for (i, e) in a.iter().enumerate() {
            m.feed(0, i as i64, &serde_json::to_vec(e).unwrap_or_default());
        }
        assert!(m.states[&0].values().any(|s| s.sessions > 1));
        assert!(m.states[&0].values().any(|s| s.session_views > 1));
    }
}
