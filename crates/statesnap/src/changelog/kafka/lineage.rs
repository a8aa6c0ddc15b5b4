//! Lineage and marker records: the reserved keys and header of statesnap's
//! marker records (lineage markers, writer claims), and the two sources of
//! the lineage — the topic id (read with `wire`) or the lowest marker.

use bytes::Bytes;

use super::reader::KafkaReader;
use super::{KafkaChangelog, wire};
use crate::changelog::Lineage;
use crate::error::{Error, Result};

/// The reserved key of lineage marker records. Applications must not write it.
pub const LINEAGE_MARKER_KEY: &[u8] = b"\x00statesnap\x00lineage";
/// The reserved key of writer claim records (writer fencing). Applications
/// must not write it.
pub const WRITER_MARKER_KEY: &[u8] = b"\x00statesnap\x00writer";
/// The header that marks a statesnap marker record, and its values.
pub(super) const MARKER_HEADER: &str = "statesnap-marker";
pub(super) const MARKER_HEADER_VALUE: &[u8] = b"lineage";
pub(super) const WRITER_HEADER_VALUE: &[u8] = b"writer";

impl KafkaChangelog {
    /// The lowest-offset marker in `[start, end)`, if any, and its offset.
    fn find_marker(&self) -> Result<Option<(u64, Lineage)>> {
        let (lo, hi) = self.watermarks()?;
        if lo >= hi {
            return Ok(None);
        }
        let mut reader = KafkaReader::open(self, lo, hi)?;
        reader.keep_markers = true;
        while let Some(batch) = reader.next_raw(1024)? {
            for r in batch {
                if r.marker && r.record.key.as_ref() == LINEAGE_MARKER_KEY {
                    let value = r.record.value.unwrap_or_default();
                    let s = String::from_utf8_lossy(&value).into_owned();
                    return Ok(Some((r.record.offset, Lineage(s))));
                }
            }
        }
        Ok(None)
    }

    /// `Ok(Ok(lineage))` from the topic id, `Ok(Err(why))` if the broker
    /// cannot serve one.
    pub(super) fn topic_id(&self) -> Result<std::result::Result<Lineage, String>> {
        match wire::fetch_topic_id(&self.at.bootstrap, &self.id.topic, self.options.request_timeout) {
            Ok(wire::TopicId::Id(id)) => {
                Ok(Ok(Lineage(format!("topic-id:{}", uuid::Uuid::from_bytes(id)))))
            }
            Ok(wire::TopicId::UnknownTopic) => Err(Error::not_found(format!(
                "kafka changelog topic does not exist changelog=`{}` bootstrap_servers=`{}`; \
                 it was deleted — the lineage is gone with it",
                self.id, self.at.bootstrap
            ))),
            Ok(wire::TopicId::Unsupported(why)) => Ok(Err(why)),
            Err(e) => Err(Error::transient(format!(
                "kafka topic id lookup failed changelog=`{}` bootstrap_servers=`{}`; is the broker reachable? retry later",
                self.id, self.at.bootstrap
            ))
            .with_source(e)),
        }
    }

    /// The lineage from the lowest marker record, writing one if there is none.
    pub(super) fn marker_lineage(&self) -> Result<Lineage> {
        if let Some((_, l)) = self.find_marker()? {
            return Ok(l);
        }
        let lineage = format!("marker:{}", uuid::Uuid::new_v4());
        let marker = (
            Bytes::from_static(LINEAGE_MARKER_KEY),
            Some(Bytes::from(lineage.clone())),
            Some(MARKER_HEADER_VALUE),
        );
        let offsets = self.append_raw(&[marker])?;
        tracing::info!(changelog = %self.id, %lineage, offset = ?offsets.first(), "wrote kafka changelog lineage marker");
        // Another process may have written one first: the lowest wins.
        match self.find_marker()? {
            Some((_, l)) => Ok(l),
            None => Err(Error::transient(format!(
                "kafka lineage marker not readable after writing it changelog=`{}` bootstrap_servers=`{}`",
                self.id, self.at.bootstrap
            ))),
        }
    }
}
