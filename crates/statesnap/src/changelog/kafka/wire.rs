//! Just enough of the Kafka wire protocol to read a topic's id (KIP-516),
//! which librdkafka receives but the `rdkafka` crate does not expose:
//! `ApiVersions` v0 to learn the broker's Metadata versions, then `Metadata`
//! v10–v12 for one topic. Plaintext connections only (no TLS, no SASL).
//!
//! Framing: every request and response is an `int32` big-endian size followed
//! by that many bytes. Request header v1 is `api_key i16, api_version i16,
//! correlation_id i32, client_id (i16 length + bytes)`; header v2 (flexible
//! versions) adds an empty tagged-field buffer (one `0` byte). Response header
//! v0 is `correlation_id i32`; v1 adds a tagged-field buffer. Flexible
//! versions use unsigned varints for compact lengths (`n + 1`, 0 = null).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const API_METADATA: i16 = 3;
const API_VERSIONS: i16 = 18;
const CLIENT_ID: &[u8] = b"statesnap-lineage";
const MAX_RESPONSE: usize = 64 << 20;

/// What a broker said about a topic's id. (`pub` only for the `fuzzing`
/// re-export, like the parse functions below.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicId {
    /// The topic exists and has this id.
    Id([u8; 16]),
    /// The topic does not exist.
    UnknownTopic,
    /// The broker cannot tell (too old for Metadata v10, or no ids).
    Unsupported(String),
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Asks each bootstrap server in turn; the first answer wins. Errors only if
/// none answered.
pub(super) fn fetch_topic_id(
    bootstrap: &str,
    topic: &str,
    timeout: Duration,
) -> io::Result<TopicId> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no bootstrap servers");
    for server in bootstrap
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let server = server.rsplit("://").next().unwrap_or(server);
        match ask(server, topic, timeout) {
            Ok(answer) => return Ok(answer),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn connect(server: &str, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("cannot resolve {server}"));
    for addr in server.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn ask(server: &str, topic: &str, timeout: Duration) -> io::Result<TopicId> {
    let deadline = Instant::now() + timeout;
    let mut conn = connect(server, timeout)?;
    conn.set_nodelay(true)?;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    conn.set_read_timeout(Some(left()))?;
    conn.set_write_timeout(Some(left()))?;

    // ApiVersions v0: which Metadata versions does the broker speak?
    let mut req = header(API_VERSIONS, 0, 1, false);
    send(&mut conn, &mut req)?;
    let body = recv(&mut conn, 1)?;
    let version = match parse_api_versions(&body)? {
        Ok(version) => version,
        Err(answer) => return Ok(answer),
    };

    // Metadata v10..=12 for the one topic.
    conn.set_read_timeout(Some(left()))?;
    let mut req = header(API_METADATA, version, 2, true);
    put_uvarint(&mut req, 2); // compact array of 1 topic
    req.extend_from_slice(&[0u8; 16]); // topic_id: unknown, ask by name
    put_uvarint(&mut req, topic.len() as u64 + 1);
    req.extend_from_slice(topic.as_bytes());
    req.push(0); // topic tagged fields
    req.push(0); // allow_auto_topic_creation = false
    if version <= 10 {
        req.push(0); // include_cluster_authorized_operations
    }
    req.push(0); // include_topic_authorized_operations
    req.push(0); // tagged fields
    send(&mut conn, &mut req)?;
    let body = recv(&mut conn, 2)?;
    parse_metadata_response(&body, topic)
}

/// Parses an `ApiVersions` v0 response body (after the correlation id):
/// `Ok(version)` is the Metadata version to ask with (10..=12), `Err(answer)`
/// the final answer when the broker cannot serve topic ids.
///
/// `pub` only so that the `fuzzing` feature can re-export it
/// (`kafka::wire_fuzz`); this module is private.
pub fn parse_api_versions(body: &[u8]) -> io::Result<Result<i16, TopicId>> {
    let mut r = Buf::new(body);
    let err = r.i16()?;
    if err != 0 {
        return Ok(Err(TopicId::Unsupported(format!(
            "api versions request failed error_code={err}"
        ))));
    }
    let n = r.i32()?;
    let mut metadata_max = None;
    for _ in 0..n.max(0) {
        let (key, _min, max) = (r.i16()?, r.i16()?, r.i16()?);
        if key == API_METADATA {
            metadata_max = Some(max);
        }
    }
    match metadata_max {
        Some(v) if v >= 10 => Ok(Ok(v.min(12))),
        other => Ok(Err(TopicId::Unsupported(format!(
            "broker does not serve topic ids (metadata max version {other:?}, need 10)"
        )))),
    }
}

/// Parses a `Metadata` v10..=12 response body (after the correlation id:
/// response header v1's tagged fields, then the body) for `topic`.
///
/// `pub` only so that the `fuzzing` feature can re-export it
/// (`kafka::wire_fuzz`); this module is private.
pub fn parse_metadata_response(body: &[u8], topic: &str) -> io::Result<TopicId> {
    let mut r = Buf::new(body);
    r.skip_tags()?; // response header v1
    parse_metadata(&mut r, topic)
}

fn parse_metadata(r: &mut Buf<'_>, topic: &str) -> io::Result<TopicId> {
    let _throttle = r.i32()?;
    for _ in 0..r.compact_len()? {
        let _node = r.i32()?;
        r.compact_str()?;
        let _port = r.i32()?;
        r.compact_str()?;
        r.skip_tags()?;
    }
    r.compact_str()?; // cluster_id
    let _controller = r.i32()?;
    let topics = r.compact_len()?;
    if topics == 0 {
        return Ok(TopicId::UnknownTopic);
    }
    // One topic was asked for; its name and id come before its partitions.
    let error_code = r.i16()?;
    let name = r.compact_str()?;
    let mut id = [0u8; 16];
    id.copy_from_slice(r.take(16)?);
    if name.is_some_and(|n| n != topic.as_bytes()) {
        return Err(invalid("metadata response names another topic"));
    }
    match error_code {
        0 if id == [0u8; 16] => Ok(TopicId::Unsupported(
            "broker returned a zero topic id".into(),
        )),
        0 => Ok(TopicId::Id(id)),
        3 => Ok(TopicId::UnknownTopic),
        other => Err(io::Error::other(format!(
            "metadata for topic failed error_code={other}"
        ))),
    }
}

fn header(api_key: i16, version: i16, correlation: i32, flexible: bool) -> Vec<u8> {
    let mut b = vec![0u8; 4]; // size, filled by send()
    b.extend_from_slice(&api_key.to_be_bytes());
    b.extend_from_slice(&version.to_be_bytes());
    b.extend_from_slice(&correlation.to_be_bytes());
    b.extend_from_slice(&(CLIENT_ID.len() as i16).to_be_bytes());
    b.extend_from_slice(CLIENT_ID);
    if flexible {
        b.push(0);
    }
    b
}

fn send(conn: &mut TcpStream, req: &mut [u8]) -> io::Result<()> {
    let len = i32::try_from(req.len() - 4).map_err(|_| invalid("request too large"))?;
    req[..4].copy_from_slice(&len.to_be_bytes());
    conn.write_all(req)?;
    conn.flush()
}

/// Reads one response, checks its correlation id, returns what follows it.
fn recv(conn: &mut TcpStream, correlation: i32) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    conn.read_exact(&mut len)?;
    let len =
        usize::try_from(i32::from_be_bytes(len)).map_err(|_| invalid("negative response size"))?;
    if !(4..=MAX_RESPONSE).contains(&len) {
        return Err(invalid(format!("response size out of range size={len}")));
    }
    let mut body = vec![0u8; len];
    conn.read_exact(&mut body)?;
    let got = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
    if got != correlation {
        return Err(invalid(format!(
            "correlation id mismatch expected={correlation} got={got}"
        )));
    }
    body.drain(..4);
    Ok(body)
}

fn put_uvarint(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push((v as u8) | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

/// A bounds-checked reader over a response body.
struct Buf<'a> {
    b: &'a [u8],
}

impl<'a> Buf<'a> {
    fn new(b: &'a [u8]) -> Self {
        Buf { b }
    }

    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(invalid("response truncated"));
        }
        let (head, tail) = self.b.split_at(n);
        self.b = tail;
        Ok(head)
    }

    fn i16(&mut self) -> io::Result<i16> {
        let s = self.take(2)?;
        Ok(i16::from_be_bytes([s[0], s[1]]))
    }

    fn i32(&mut self) -> io::Result<i32> {
        let s = self.take(4)?;
        Ok(i32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn uvarint(&mut self) -> io::Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(invalid("varint too long"))
    }

    /// A compact array/string length (`n + 1` on the wire, 0 = null → 0).
    fn compact_len(&mut self) -> io::Result<usize> {
        let n = self.uvarint()?;
        usize::try_from(n.saturating_sub(1)).map_err(|_| invalid("length out of range"))
    }

    fn compact_str(&mut self) -> io::Result<Option<&'a [u8]>> {
        let n = self.uvarint()?;
        if n == 0 {
            return Ok(None);
        }
        let n = usize::try_from(n - 1).map_err(|_| invalid("length out of range"))?;
        self.take(n).map(Some)
    }

    fn skip_tags(&mut self) -> io::Result<()> {
        for _ in 0..self.uvarint()? {
            let _tag = self.uvarint()?;
            let size =
                usize::try_from(self.uvarint()?).map_err(|_| invalid("tag size out of range"))?;
            self.take(size)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compact_str(b: &mut Vec<u8>, s: &[u8]) {
        put_uvarint(b, s.len() as u64 + 1);
        b.extend_from_slice(s);
    }

    fn response(topic: &[u8], error_code: i16, id: [u8; 16]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&0i32.to_be_bytes()); // throttle
        put_uvarint(&mut b, 2); // one broker
        b.extend_from_slice(&1i32.to_be_bytes());
        compact_str(&mut b, b"127.0.0.1");
        b.extend_from_slice(&9092i32.to_be_bytes());
        b.push(0); // null rack
        b.extend_from_slice(&[1, 7, 2, 0xaa, 0xbb]); // one tagged field of 2 bytes
        compact_str(&mut b, b"cluster");
        b.extend_from_slice(&1i32.to_be_bytes());
        put_uvarint(&mut b, 2); // one topic
        b.extend_from_slice(&error_code.to_be_bytes());
        compact_str(&mut b, topic);
        b.extend_from_slice(&id);
        b
    }

    #[test]
    fn parses_topic_id_and_errors_from_metadata_responses() {
        let id = [7u8; 16];
        let r = response(b"t", 0, id);
        assert_eq!(
            parse_metadata(&mut Buf::new(&r), "t").expect("parse"),
            TopicId::Id(id)
        );
        let r = response(b"t", 3, [0; 16]);
        assert_eq!(
            parse_metadata(&mut Buf::new(&r), "t").expect("parse"),
            TopicId::UnknownTopic
        );
        let r = response(b"t", 0, [0; 16]);
        assert!(matches!(
            parse_metadata(&mut Buf::new(&r), "t"),
            Ok(TopicId::Unsupported(_))
        ));
        let r = response(b"other", 0, id);
        assert!(parse_metadata(&mut Buf::new(&r), "t").is_err());
        let r = response(b"t", 0, id);
        for cut in 0..r.len() - 1 {
            assert!(
                parse_metadata(&mut Buf::new(&r[..cut]), "t").is_err(),
                "truncated at {cut}"
            );
        }
    }

    fn api_versions(error_code: i16, apis: &[(i16, i16)]) -> Vec<u8> {
        let mut b = error_code.to_be_bytes().to_vec();
        b.extend_from_slice(&(apis.len() as i32).to_be_bytes());
        for &(key, max) in apis {
            b.extend_from_slice(&key.to_be_bytes());
            b.extend_from_slice(&0i16.to_be_bytes());
            b.extend_from_slice(&max.to_be_bytes());
        }
        b
    }

    #[test]
    fn picks_the_metadata_version_from_api_versions_responses() {
        let ok = |b: &[u8]| parse_api_versions(b).expect("parse");
        assert_eq!(ok(&api_versions(0, &[(0, 9), (API_METADATA, 13)])), Ok(12));
        assert_eq!(ok(&api_versions(0, &[(API_METADATA, 10)])), Ok(10));
        assert!(matches!(
            ok(&api_versions(0, &[(API_METADATA, 9)])),
            Err(TopicId::Unsupported(why)) if why.contains("Some(9)")
        ));
        assert!(matches!(
            ok(&api_versions(0, &[(0, 9)])),
            Err(TopicId::Unsupported(why)) if why.contains("None")
        ));
        assert!(matches!(
            ok(&api_versions(35, &[])),
            Err(TopicId::Unsupported(why)) if why.contains("error_code=35")
        ));
        let r = api_versions(0, &[(API_METADATA, 12)]);
        for cut in 0..r.len() {
            assert!(parse_api_versions(&r[..cut]).is_err(), "truncated at {cut}");
        }
    }

    #[test]
    fn metadata_response_starts_with_the_header_tags() {
        let id = [9u8; 16];
        let mut r = vec![0u8]; // response header v1: no tagged fields
        r.extend_from_slice(&response(b"t", 0, id));
        assert_eq!(
            parse_metadata_response(&r, "t").expect("parse"),
            TopicId::Id(id)
        );
        assert!(parse_metadata_response(&[], "t").is_err());
    }

    #[test]
    fn varints_round_trip() {
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u32::MAX as u64,
            u64::MAX,
        ] {
            let mut b = Vec::new();
            put_uvarint(&mut b, v);
            assert_eq!(Buf::new(&b).uvarint().expect("varint"), v);
        }
    }
}
