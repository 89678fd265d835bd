//! What the swarm measures besides counts: acknowledgement latencies and a
//! process's CPU time and memory, read from `/proc`.

use std::time::Duration;

/// Latency samples, microseconds, one per acknowledged batch.
#[derive(Debug, Default, Clone)]
pub struct Latencies {
    samples: Vec<u32>,
}

impl Latencies {
    /// Adds one sample (saturating at `u32::MAX` µs, about 71 minutes).
    pub fn push(&mut self, latency: Duration) {
        self.samples
            .push(u32::try_from(latency.as_micros()).unwrap_or(u32::MAX));
    }

    /// Adds every sample of `other`.
    pub fn extend(&mut self, other: &Latencies) {
        self.samples.extend_from_slice(&other.samples);
    }

    /// Samples so far.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether there is no sample.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The `q` quantile (0.0..=1.0) by the nearest-rank method; `None`
    /// without samples.
    pub fn quantile(&mut self, q: f64) -> Option<Duration> {
        if self.samples.is_empty() {
            return None;
        }
        self.samples.sort_unstable();
        let rank = (q.clamp(0.0, 1.0) * self.samples.len() as f64).ceil() as usize;
        let at = rank.saturating_sub(1).min(self.samples.len() - 1);
        Some(Duration::from_micros(u64::from(self.samples[at])))
    }
}

/// CPU time and memory of one process at one moment, from
/// `/proc/{pid}/stat` and `/proc/{pid}/status`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcSample {
    /// User plus system CPU time of all its threads, seconds (clock ticks
    /// of 1/100 s).
    pub cpu_seconds: f64,
    /// Resident set size, bytes (`VmRSS`).
    pub rss_bytes: u64,
    /// Peak resident set size, bytes (`VmHWM`).
    pub peak_rss_bytes: u64,
}

impl ProcSample {
    /// Reads process `pid`; `None` if it is gone or its files do not parse.
    pub fn read(pid: u32) -> Option<ProcSample> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The fields after the parenthesised command name; utime and stime
        // are the 14th and 15th fields of the whole line.
        let rest = stat.get(stat.rfind(')')? + 2..)?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib = |name: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(name))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        };
        Some(ProcSample {
            cpu_seconds: ticks as f64 / 100.0,
            rss_bytes: kib("VmRSS:")? * 1024,
            peak_rss_bytes: kib("VmHWM:")? * 1024,
        })
    }
}

/// QUIC transport counters summed over the swarm's connections, from
/// each connection's `quinn::ConnectionStats` when it closes: how the
/// bytes were cut into datagrams and system calls, and how many
/// acknowledgements and flow-control updates the broker sent for them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TransportTotals {
    /// Datagrams the edges sent.
    pub datagrams_sent: u64,
    /// `sendmsg` calls carrying them (fewer than datagrams with GSO).
    pub send_calls: u64,
    /// Datagrams the edges received (the broker's ACKs, acknowledgement
    /// datagrams and frames, flow-control updates).
    pub datagrams_received: u64,
    /// QUIC ACK frames the edges received from the broker.
    pub acks_received: u64,
    /// `MAX_DATA` and `MAX_STREAM_DATA` frames the edges received
    /// (flow-control credit).
    pub credit_updates_received: u64,
    /// Congestion events (window reductions) at the edges.
    pub congestion_events: u64,
    /// Packets the edges declared lost.
    pub lost_packets: u64,
}

impl TransportTotals {
    /// Adds one connection's statistics.
    pub fn add(&mut self, stats: &quinn::ConnectionStats) {
        self.datagrams_sent += stats.udp_tx.datagrams;
        self.send_calls += stats.udp_tx.ios;
        self.datagrams_received += stats.udp_rx.datagrams;
        self.acks_received += stats.frame_rx.acks;
        self.credit_updates_received += stats.frame_rx.max_data + stats.frame_rx.max_stream_data;
        self.congestion_events += stats.path.congestion_events;
        self.lost_packets += stats.path.lost_packets;
    }

    /// Adds another total.
    pub fn merge(&mut self, other: &TransportTotals) {
        self.datagrams_sent += other.datagrams_sent;
        self.send_calls += other.send_calls;
        self.datagrams_received += other.datagrams_received;
        self.acks_received += other.acks_received;
        self.credit_updates_received += other.credit_updates_received;
        self.congestion_events += other.congestion_events;
        self.lost_packets += other.lost_packets;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut l = Latencies::default();
        assert_eq!(l.quantile(0.5), None);
        for us in (1..=1000).rev() {
            l.push(Duration::from_micros(us));
        }
        assert_eq!(l.quantile(0.5), Some(Duration::from_micros(500)));
        assert_eq!(l.quantile(0.99), Some(Duration::from_micros(990)));
        assert_eq!(l.quantile(0.999), Some(Duration::from_micros(999)));
        assert_eq!(l.quantile(1.0), Some(Duration::from_micros(1000)));
        assert_eq!(l.quantile(0.0), Some(Duration::from_micros(1)));
    }

    #[test]
    fn reads_this_process() {
        let sample = ProcSample::read(std::process::id()).expect("/proc/self");
        assert!(sample.rss_bytes > 0);
        assert!(sample.peak_rss_bytes >= sample.rss_bytes);
    }
}
