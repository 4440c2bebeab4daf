//! Just enough of the DNS wire format (RFC 1035 §4) for this crate: an A query for one
//! name, the A records of its answer, and rewriting the addresses of A records in a
//! response that passes through the pod network's relay.
//!
//! A message is a 12-byte header (id, flags, and the counts of questions, answers,
//! authority and additional records), the questions (a name, a type, a class), then the
//! records (a name, type, class, TTL, the data's length, the data). Names are labels of
//! at most 63 bytes, each after its length, ending with a zero byte or a two-byte pointer
//! (its top two bits set) to a name earlier in the message. An A record's data is its
//! four address bytes.

use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use tokio::net::UdpSocket;

/// Why a DNS exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The name cannot be written as a DNS name.
    #[error("{0:?} is not a DNS name (labels of 1 to 63 bytes, 255 in all)")]
    BadName(String),
    /// A socket operation failed.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    /// No answer came in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The answer is not a DNS response to the query.
    #[error("malformed response: {0}")]
    Malformed(&'static str),
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The response code of a successful answer.
pub const NOERROR: u8 = 0;
/// The response code of a name that does not exist.
pub const NXDOMAIN: u8 = 3;

/// Record type A (an IPv4 address).
const TYPE_A: u16 = 1;
/// Class IN (the Internet).
const CLASS_IN: u16 = 1;
/// Header flags of a query: recursion desired, as resolvers send it.
const FLAGS_QUERY: u16 = 0x0100;
/// The header flag of a response.
const FLAG_RESPONSE: u16 = 0x8000;
/// Length of the header.
const HEADER: usize = 12;
/// Largest UDP answer read: the largest UDP payload.
pub const MAX_MESSAGE: usize = 65_535;

/// What a server answered to an A query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The response code ([`NOERROR`], [`NXDOMAIN`], 2 for SERVFAIL, ...).
    pub rcode: u8,
    /// The addresses of the A records in the answer section, in their order.
    pub addrs: Vec<Ipv4Addr>,
}

/// Asks `server` over UDP for the A records of `name`, waiting at most `timeout`.
pub async fn query_a(server: SocketAddr, name: &str, timeout: Duration) -> Result<Answer> {
    let id = next_id();
    let query = a_query(id, name)?;
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    socket.connect(server).await?;
    socket.send(&query).await?;
    let mut buf = vec![0; MAX_MESSAGE];
    let exchange = async {
        loop {
            let n = socket.recv(&mut buf).await?;
            // A late answer to an earlier query on a reused port is not ours: read on.
            if buf.get(..2) == Some(&id.to_be_bytes()[..]) {
                return parse_answer(id, &buf[..n]);
            }
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| Error::Timeout(timeout))?
}

/// A query for the A records of `name` (with or without its final dot) with this `id`.
pub fn a_query(id: u16, name: &str) -> Result<Vec<u8>> {
    let bad = || Error::BadName(name.to_string());
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    let mut packet = Vec::with_capacity(HEADER + trimmed.len() + 6);
    for word in [id, FLAGS_QUERY, 1, 0, 0, 0] {
        packet.extend_from_slice(&word.to_be_bytes());
    }
    for label in trimmed.split('.') {
        let len = u8::try_from(label.len())
            .ok()
            .filter(|l| (1..=63).contains(l));
        packet.push(len.ok_or_else(bad)?);
        packet.extend_from_slice(label.as_bytes());
    }
    packet.push(0);
    if packet.len() - HEADER > 255 {
        return Err(bad());
    }
    packet.extend_from_slice(&TYPE_A.to_be_bytes());
    packet.extend_from_slice(&CLASS_IN.to_be_bytes());
    Ok(packet)
}

/// The response code and answer-section A records of a response to the query `id`.
pub fn parse_answer(id: u16, packet: &[u8]) -> Result<Answer> {
    let message = Message::read(packet)?;
    if message.id != id {
        return Err(Error::Malformed("the id is not the query's"));
    }
    let addrs = message
        .records
        .iter()
        .filter(|r| r.section == Section::Answer && r.is_a())
        .filter_map(|r| <[u8; 4]>::try_from(&packet[r.data.clone()]).ok())
        .map(Ipv4Addr::from)
        .collect();
    Ok(Answer {
        rcode: message.rcode,
        addrs,
    })
}

/// Rewrites, in every section of the response `packet`, the address of each A record for
/// which `map` gives another; returns how many it rewrote. A packet that cannot be read
/// is an error and is left as it was.
pub fn rewrite_a(packet: &mut [u8], map: impl Fn(Ipv4Addr) -> Option<Ipv4Addr>) -> Result<usize> {
    let message = Message::read(packet)?;
    let mut rewritten = 0;
    for record in message.records.iter().filter(|r| r.is_a()) {
        let Some(bytes) = packet.get_mut(record.data.clone()) else {
            continue;
        };
        let Ok(old) = <[u8; 4]>::try_from(&*bytes) else {
            continue;
        };
        if let Some(new) = map(Ipv4Addr::from(old)) {
            bytes.copy_from_slice(&new.octets());
            rewritten += 1;
        }
    }
    Ok(rewritten)
}

/// A query id: a counter started from the process id and the clock, so that ids differ
/// between processes and between queries of one.
fn next_id() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id();
    let seed = (seed ^ (seed >> 16)) as u16;
    seed.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed).wrapping_mul(40_503))
}

/// The section a record is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Answer,
    Authority,
    Additional,
}

/// Where one record is in a message.
#[derive(Debug)]
struct Record {
    section: Section,
    kind: u16,
    class: u16,
    data: Range<usize>,
}

impl Record {
    fn is_a(&self) -> bool {
        self.kind == TYPE_A && self.class == CLASS_IN && self.data.len() == 4
    }
}

/// A response's header fields and where its records are.
struct Message {
    id: u16,
    rcode: u8,
    records: Vec<Record>,
}

impl Message {
    fn read(packet: &[u8]) -> Result<Message> {
        let mut reader = Reader { packet, at: 0 };
        let id = reader.u16()?;
        let flags = reader.u16()?;
        if flags & FLAG_RESPONSE == 0 {
            return Err(Error::Malformed("a query, not a response"));
        }
        let counts = [reader.u16()?, reader.u16()?, reader.u16()?, reader.u16()?];
        for _ in 0..counts[0] {
            reader.skip_name()?;
            reader.skip(4)?;
        }
        let sections = [Section::Answer, Section::Authority, Section::Additional];
        let mut records = Vec::new();
        for (section, count) in sections.into_iter().zip(&counts[1..]) {
            for _ in 0..*count {
                reader.skip_name()?;
                let kind = reader.u16()?;
                let class = reader.u16()?;
                reader.skip(4)?;
                let len = usize::from(reader.u16()?);
                let start = reader.at;
                reader.skip(len)?;
                records.push(Record {
                    section,
                    kind,
                    class,
                    data: start..start + len,
                });
            }
        }
        Ok(Message {
            id,
            rcode: (flags & 0x000f) as u8,
            records,
        })
    }
}

/// A cursor over a message that never reads past its end.
struct Reader<'a> {
    packet: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn skip(&mut self, n: usize) -> Result<()> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.packet.len());
        self.at = end.ok_or(Error::Malformed("truncated"))?;
        Ok(())
    }

    fn u16(&mut self) -> Result<u16> {
        let bytes = self
            .packet
            .get(self.at..self.at + 2)
            .ok_or(Error::Malformed("truncated"))?;
        self.at += 2;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    /// Skips a name: labels up to a zero byte, or up to and including a pointer.
    fn skip_name(&mut self) -> Result<()> {
        loop {
            let len = *self
                .packet
                .get(self.at)
                .ok_or(Error::Malformed("truncated name"))?;
            match len {
                0 => return self.skip(1),
                l if l & 0xc0 == 0xc0 => return self.skip(2),
                l if l & 0xc0 == 0 => self.skip(1 + usize::from(l))?,
                _ => return Err(Error::Malformed("unknown label type")),
            }
        }
    }
}

#[cfg(test)]
mod tests;
