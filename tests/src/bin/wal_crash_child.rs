//! Child process for the WAL crash test (`tests/tests/wal_crash.rs`).
//!
//! `wal_crash_child DIR GENERATION PRODUCERS SYNC_MODE` opens the WAL in DIR
//! and runs PRODUCERS concurrent appenders until it is killed (or 200,000
//! appends, a safety bound). After every acknowledged append it prints one
//! line to stdout, `BASE COUNT GENERATION PRODUCER SEQ`, and flushes it: the
//! parent treats exactly the printed lines as acknowledged.

use std::io::Write;
use std::sync::Arc;

use anyhow::{Context, bail};
use broker_core::wal::{SyncMode, Wal};
use tributary_proto::Codec;
use tributary_tests::crash::{crash_wal_config, records_for};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, generation, producers, mode] = args.as_slice() else {
        bail!("usage: wal_crash_child DIR GENERATION PRODUCERS SYNC_MODE");
    };
    let generation: u64 = generation.parse().context("GENERATION")?;
    let producers: u64 = producers.parse().context("PRODUCERS")?;
    let mode: SyncMode = mode.parse().map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let wal = Arc::new(Wal::open(dir, crash_wal_config(mode))?);
        let stdout = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        let mut tasks = Vec::new();
        for producer in 0..producers {
            let wal = wal.clone();
            let stdout = stdout.clone();
            tasks.push(tokio::spawn(async move {
                for seq in 0..200_000u64 {
                    let records = records_for(generation, producer, seq);
                    let count = records.len();
                    let ack = wal.append(records, Codec::None).await?;
                    let mut out = stdout.lock().map_err(|_| anyhow::anyhow!("stdout lock"))?;
                    writeln!(
                        out,
                        "{} {count} {generation} {producer} {seq}",
                        ack.base_offset
                    )?;
                    out.flush()?;
                }
                anyhow::Ok(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        anyhow::Ok(())
    })
}
