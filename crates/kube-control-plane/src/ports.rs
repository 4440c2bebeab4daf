//! Free loopback ports for servers that are told their port before they bind it.
//!
//! A port the kernel hands out for `127.0.0.1:0` and that is then released comes from the
//! ephemeral range, which the kernel also uses for the local end of every outgoing
//! connection: under traffic, one of them can take the port before its server binds it
//! ("Address already in use"). A port just below that range is never given to an outgoing
//! connection, so only another explicit bind can take it.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// Lowest port tried.
const FIRST: u16 = 10_000;

/// Where the kernel's ephemeral range starts (`ip_local_port_range`), 32768 if unknown.
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .filter(|&start: &u16| start > FIRST + 1_000)
        .unwrap_or(32_768)
}

/// A loopback port free now, below the ephemeral range where one is; else one the kernel
/// picks.
pub fn free_loopback_port() -> std::io::Result<SocketAddr> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = u32::from(ephemeral_start() - FIRST);
    // Spread over the range by process, so concurrent test processes rarely try the same.
    let seed = std::process::id().wrapping_mul(2_654_435_761);
    for _ in 0..64 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let offset = seed.wrapping_add(n.wrapping_mul(7_919)) % span;
        let port = FIRST + u16::try_from(offset).unwrap_or(0);
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            return listener.local_addr();
        }
    }
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports come from below the ephemeral range, differ from one call to the next, and
    /// can be bound.
    #[test]
    fn ports_are_free_distinct_and_below_the_ephemeral_range() {
        let a = free_loopback_port().unwrap();
        let b = free_loopback_port().unwrap();
        assert_ne!(a.port(), b.port());
        for addr in [a, b] {
            assert!(
                addr.port() >= FIRST && addr.port() < ephemeral_start(),
                "{addr}"
            );
            TcpListener::bind(addr).unwrap();
        }
    }
}
