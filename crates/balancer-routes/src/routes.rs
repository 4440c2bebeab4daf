//! What a balancer answered, reduced to addresses: [`Address`] (an IP with or without a
//! port), [`parse_address`] for every spelling balancers use, and [`Routes`], the set a
//! caller asks [`Routes::routes_to`].
//!
//! A balancer names a server as `10.0.0.5`, `10.0.0.5:8080`, `[fd00::5]:8080` or a URL
//! (`http://10.0.0.5:8080/`); all become an [`Address`] whose IP is canonical (an
//! IPv4-mapped IPv6 address is its IPv4 address), so a pod IP matches however the
//! balancer wrote it. An address without a port matches the IP on every port.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// One server a balancer routes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Address {
    /// The balancer named the port too.
    Socket(SocketAddr),
    /// The balancer named the IP only: it matches the IP on every port.
    Ip(IpAddr),
}

impl Address {
    /// The server's IP.
    pub fn ip(&self) -> IpAddr {
        match self {
            Self::Socket(socket) => socket.ip(),
            Self::Ip(ip) => *ip,
        }
    }

    /// The server's port, when the balancer named it.
    pub fn port(&self) -> Option<u16> {
        match self {
            Self::Socket(socket) => Some(socket.port()),
            Self::Ip(_) => None,
        }
    }

    /// The address with the port given, unless it already has one.
    pub fn with_port(self, port: u16) -> Self {
        match self {
            Self::Ip(ip) => Self::Socket(SocketAddr::new(ip, port)),
            socket => socket,
        }
    }
}

/// Reads a server address as balancers write it: `ip`, `ip:port`, `[v6]`, `[v6]:port`,
/// or a URL `scheme://[user@]host[:port][/…]` whose host is an IP. A URL without a
/// port gives the IP alone (no default port is assumed, so it matches every port).
/// `None` for anything else: a host name, `unix`, an empty string.
pub fn parse_address(text: &str) -> Option<Address> {
    let text = text.trim();
    let authority = match text.split_once("://") {
        Some((_scheme, rest)) => {
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let authority = &rest[..end];
            authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host)
        }
        None => text,
    };
    let address = if let Ok(socket) = authority.parse::<SocketAddr>() {
        Address::Socket(socket)
    } else if let Ok(ip) = authority.parse::<IpAddr>() {
        Address::Ip(ip)
    } else {
        let inner = authority.strip_prefix('[')?.strip_suffix(']')?;
        Address::Ip(IpAddr::V6(inner.parse::<Ipv6Addr>().ok()?))
    };
    Some(canonical(address))
}

/// The address with an IPv4-mapped IPv6 IP (`::ffff:10.0.0.5`) written as IPv4.
fn canonical(address: Address) -> Address {
    match address {
        Address::Socket(socket) => {
            Address::Socket(SocketAddr::new(socket.ip().to_canonical(), socket.port()))
        }
        Address::Ip(ip) => Address::Ip(ip.to_canonical()),
    }
}

/// The servers a balancer routes to at the time it was asked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routes {
    addresses: BTreeSet<Address>,
}

impl Routes {
    /// Whether the balancer routes to `ip` (on `port`, when given). An address the
    /// balancer reported without a port matches every port; a `port` of `None` matches
    /// the IP on every port.
    pub fn routes_to(&self, ip: IpAddr, port: Option<u16>) -> bool {
        let ip = ip.to_canonical();
        self.addresses.iter().any(|address| {
            address.ip() == ip
                && match (address.port(), port) {
                    (Some(routed), Some(asked)) => routed == asked,
                    _ => true,
                }
        })
    }

    /// The balancer routes to nobody.
    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty()
    }

    /// How many distinct addresses the balancer routes to.
    pub fn len(&self) -> usize {
        self.addresses.len()
    }

    /// The addresses, in order.
    pub fn addresses(&self) -> impl Iterator<Item = &Address> {
        self.addresses.iter()
    }

    /// Adds an address (canonicalised like [`parse_address`]'s).
    pub fn insert(&mut self, address: Address) {
        self.addresses.insert(canonical(address));
    }
}

impl FromIterator<Address> for Routes {
    fn from_iter<I: IntoIterator<Item = Address>>(addresses: I) -> Self {
        let mut routes = Self::default();
        addresses
            .into_iter()
            .for_each(|address| routes.insert(address));
        routes
    }
}

#[cfg(test)]
mod tests;
