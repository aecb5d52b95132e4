//! Whether `server start` encrypts: by default, whenever its traffic can leave the machine.
//!
//! Task commands, their environments (often holding tokens) and streamed outputs cross the
//! server's connections, so a server reachable from the network encrypts unless told not to,
//! as HyperQueue does. On loopback nothing leaves the machine, and plain TCP saves the
//! handshake and the per-frame cipher.

use crate::args::{TlsArgs, TlsMode};
use anyhow::{bail, Result};
use kestrel_server::TlsConfig;
use std::net::IpAddr;

/// Whether a `--host` to listen on reaches only this machine. Anything not plainly loopback
/// (`0.0.0.0`, `::`, a host name, an interface's address) counts as the network.
pub fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => bare.eq_ignore_ascii_case("localhost"),
    }
}

/// The server's TLS set-up for these options on `host`, or `None` for plain TCP.
pub fn choose(host: &str, tls: TlsArgs) -> Result<Option<TlsConfig>> {
    let encrypt = match tls.tls {
        TlsMode::On => true,
        TlsMode::Off => false,
        TlsMode::Auto => tls.tls_cert.is_some() || !is_loopback(host),
    };
    match (tls.tls_cert, tls.tls_key) {
        (Some(_), Some(_)) if !encrypt => {
            bail!("--tls off and --tls-cert contradict each other: drop one of them")
        }
        (Some(cert), Some(key)) => Ok(Some(TlsConfig::Files { cert, key })),
        _ if encrypt => Ok(Some(TlsConfig::SelfSigned)),
        _ => Ok(None),
    }
}

/// How the start-up line names the transport, so that a user sees whether traffic is in clear.
pub fn describe(host: &str, config: &Option<TlsConfig>) -> &'static str {
    match (config, is_loopback(host)) {
        (Some(_), _) => "TLS",
        (None, true) => "plain TCP on loopback",
        (None, false) => "plain TCP, in clear on the network as --tls off asks",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn args(tls: TlsMode) -> TlsArgs {
        TlsArgs {
            tls,
            tls_cert: None,
            tls_key: None,
        }
    }

    #[test]
    fn loopback_hosts_are_told_from_network_ones() {
        for host in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "[::1]",
            "localhost",
            "LOCALHOST",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["0.0.0.0", "::", "10.0.0.5", "node17", "", "fe80::1"] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn auto_encrypts_beyond_loopback_only() {
        let on = |host: &str, mode| choose(host, args(mode)).unwrap().is_some();
        assert!(on("0.0.0.0", TlsMode::Auto), "the default --host encrypts");
        assert!(on("node17", TlsMode::Auto));
        assert!(!on("127.0.0.1", TlsMode::Auto), "loopback stays plain");
        assert!(on("127.0.0.1", TlsMode::On));
        assert!(!on("0.0.0.0", TlsMode::Off));
    }

    #[test]
    fn a_certificate_means_tls_and_contradicts_off() {
        let with_cert = |tls| TlsArgs {
            tls,
            tls_cert: Some(PathBuf::from("c.pem")),
            tls_key: Some(PathBuf::from("k.pem")),
        };
        assert!(matches!(
            choose("127.0.0.1", with_cert(TlsMode::Auto)).unwrap(),
            Some(TlsConfig::Files { .. })
        ));
        let err = choose("0.0.0.0", with_cert(TlsMode::Off)).unwrap_err();
        assert!(err.to_string().contains("contradict"), "{err}");
    }

    #[test]
    fn the_start_line_says_when_traffic_is_in_clear() {
        assert_eq!(describe("0.0.0.0", &Some(TlsConfig::SelfSigned)), "TLS");
        assert!(describe("0.0.0.0", &None).contains("in clear"));
        assert!(!describe("127.0.0.1", &None).contains("in clear"));
    }
}
