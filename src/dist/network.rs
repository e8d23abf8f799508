//! Which local interface a rank talks to its peers on. Gloo and NCCL each pick one of their own
//! unless told (`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`): Gloo binds the address this host's
//! name resolves to, which on many machines (Debian's /etc/hosts, containers) is a loopback
//! address, so a rank on another node is told to connect to 127.0.0.1 and the job hangs. The
//! master's address is known, so the right interface is too: the one the kernel routes to the
//! master from (the local address of a socket connected to it; UDP, so nothing is sent).
use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};

use anyhow::Result;

use crate::error::user_error;

/// How this rank reaches its peers, for the process group and the banner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The interface's name, or the variable's value when the user set one.
    pub iface: String,
    /// The local address Gloo binds (None when the user's variable decides).
    pub addr: Option<IpAddr>,
    /// How it was chosen, for the banner.
    pub why: String,
}

/// The variables that choose the interface in PyTorch, honoured as they are when set.
pub const GLOO_VAR: &str = "GLOO_SOCKET_IFNAME";
pub const NCCL_VAR: &str = "NCCL_SOCKET_IFNAME";

/// The route to the master at `master:port`; `var`: the backend's interface variable, if set.
pub fn route_to_master(master: &str, port: u16, var: Option<(&str, String)>) -> Result<Route> {
    if let Some((name, value)) = var.filter(|(_, v)| !v.is_empty()) {
        return Ok(Route {
            iface: value.clone(),
            addr: None,
            why: format!("{name}={value}"),
        });
    }
    let master_ip = resolve(master, port)?;
    if master_ip.ip().is_loopback() {
        return Ok(Route {
            iface: "lo".into(),
            addr: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            why: "the master is this host's loopback".into(),
        });
    }
    let local = local_address_towards(master_ip).map_err(|e| {
        user_error(format!(
            "no route from this host to the master {master} ({master_ip}): {e}"
        ))
    })?;
    let iface = interface_of(local).unwrap_or_else(|| "?".into());
    Ok(Route {
        iface,
        addr: Some(local),
        why: format!(
            "on the route to the master {}; set {GLOO_VAR}/{NCCL_VAR} to choose another",
            master_ip.ip()
        ),
    })
}

/// The master's first address (a name from Slurm's node list resolves through the hosts file
/// or DNS, as c10d's store client resolves it).
fn resolve(master: &str, port: u16) -> Result<SocketAddr> {
    let mut addrs = (master, port)
        .to_socket_addrs()
        .map_err(|e| user_error(format!("cannot resolve the master address {master}: {e}")))?;
    addrs
        .next()
        .ok_or_else(|| user_error(format!("the master address {master} resolves to nothing")))
}

/// The source address the kernel would use to reach `to`.
fn local_address_towards(to: SocketAddr) -> std::io::Result<IpAddr> {
    let any: SocketAddr = match to {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().unwrap(),
        SocketAddr::V6(_) => "[::]:0".parse().unwrap(),
    };
    let s = UdpSocket::bind(any)?;
    s.connect(to)?; // a UDP connect only picks the route; nothing goes on the wire
    Ok(s.local_addr()?.ip())
}

/// The name of the interface that holds `addr`.
pub fn interface_of(addr: IpAddr) -> Option<String> {
    interfaces().into_iter().find(|(_, a)| *a == addr).map(|(name, _)| name)
}

/// Every (interface, address) pair of this host, IPv4 and IPv6.
pub fn interfaces() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list that freeifaddrs releases below; each entry is
    // read only while the list lives.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut p = head;
        while !p.is_null() {
            let ifa = &*p;
            p = ifa.ifa_next;
            if ifa.ifa_addr.is_null() {
                continue;
            }
            let name = CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned();
            let addr = match (*ifa.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()) // network order in memory
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::from(sin6.sin6_addr.s6_addr)
                }
                _ => continue,
            };
            out.push((name, addr));
        }
        libc::freeifaddrs(head);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_to_a_loopback_master_is_loopback_and_a_set_variable_wins() {
        let r = route_to_master("127.0.0.1", 29500, None).unwrap();
        assert_eq!(
            (r.iface.as_str(), r.addr),
            ("lo", Some(IpAddr::V4(Ipv4Addr::LOCALHOST)))
        );
        let r = route_to_master("localhost", 29500, None).unwrap();
        assert_eq!(r.iface, "lo");
        let r = route_to_master("10.1.2.3", 29500, Some((GLOO_VAR, "eth7".into()))).unwrap();
        assert_eq!((r.iface.as_str(), r.addr), ("eth7", None));
        assert_eq!(r.why, "GLOO_SOCKET_IFNAME=eth7");
        // An empty variable is unset, as in PyTorch.
        assert_eq!(
            route_to_master("127.0.0.1", 1, Some((GLOO_VAR, String::new())))
                .unwrap()
                .iface,
            "lo"
        );
    }

    #[test]
    fn every_local_address_is_found_on_its_interface() {
        let all = interfaces();
        assert!(all.iter().any(|(n, a)| n == "lo" && a.is_loopback()), "{all:?}");
        for (name, addr) in &all {
            // A route to one's own address leaves from that address.
            if addr.is_ipv4() {
                assert_eq!(
                    interface_of(*addr).as_deref().map(|n| !n.is_empty()),
                    Some(true),
                    "{name}"
                );
                let r = route_to_master(&addr.to_string(), 29500, None).unwrap();
                assert_eq!(
                    r.addr.map(|a| a.is_loopback()),
                    Some(addr.is_loopback()),
                    "{name} {addr}"
                );
            }
        }
        let e = route_to_master("no-such-host.invalid", 29500, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot resolve the master address no-such-host.invalid"),
            "{e}"
        );
    }
}
