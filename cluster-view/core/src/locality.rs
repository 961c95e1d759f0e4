//! Locality levels, tightest to loosest.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How close the GPUs of a gang are to each other.
///
/// `PcieSwitch` also covers GPUs that share one NVLink group: such GPUs talk at least as fast as
/// GPUs under one PCIe switch. The order is the derive order: tightest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LocalityLevel {
    /// All GPUs under one PCIe switch (or in one NVLink group) of one server.
    PcieSwitch,
    /// All GPUs under one CPU socket of one server.
    Socket,
    /// All GPUs in one server.
    Server,
    /// All servers in one rack.
    Rack,
    /// All servers in one InfiniBand domain.
    IbDomain,
    /// Anywhere in the cluster.
    Any,
}

impl LocalityLevel {
    /// Every level, tightest first.
    pub const ALL: [LocalityLevel; 6] = [
        LocalityLevel::PcieSwitch,
        LocalityLevel::Socket,
        LocalityLevel::Server,
        LocalityLevel::Rack,
        LocalityLevel::IbDomain,
        LocalityLevel::Any,
    ];

    /// The kebab-case name used in files and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            LocalityLevel::PcieSwitch => "pcie-switch",
            LocalityLevel::Socket => "socket",
            LocalityLevel::Server => "server",
            LocalityLevel::Rack => "rack",
            LocalityLevel::IbDomain => "ib-domain",
            LocalityLevel::Any => "any",
        }
    }

    /// Position in [`LocalityLevel::ALL`].
    pub fn rank(self) -> usize {
        self as usize
    }

    /// The level `steps` looser than this one, saturating at `Any`.
    pub fn relaxed_by(self, steps: usize) -> LocalityLevel {
        LocalityLevel::ALL[(self.rank() + steps).min(LocalityLevel::ALL.len() - 1)]
    }

    /// True for levels that keep a gang inside one server.
    pub fn is_intra_server(self) -> bool {
        self <= LocalityLevel::Server
    }
}

impl fmt::Display for LocalityLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LocalityLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LocalityLevel::ALL.into_iter().find(|l| l.as_str() == s).ok_or_else(|| {
            format!("unknown locality level `{s}` (expected one of pcie-switch, socket, server, rack, ib-domain, any)")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_names_round_trip() {
        for w in LocalityLevel::ALL.windows(2) {
            assert!(w[0] < w[1]);
        }
        for l in LocalityLevel::ALL {
            assert_eq!(l.as_str().parse::<LocalityLevel>(), Ok(l));
        }
        assert!("rackk".parse::<LocalityLevel>().is_err());
        assert_eq!(LocalityLevel::Server.relaxed_by(10), LocalityLevel::Any);
    }
}
