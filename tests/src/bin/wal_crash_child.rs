//! Child process for the WAL crash test (`tests/tests/wal_crash.rs`).
//!
//! `wal_crash_child DIR GENERATION TOPICS PRODUCERS SYNC_MODE` opens TOPICS
//! WALs in `DIR/t0`, `DIR/t1`, … (sharing the process's writer pool) and
//! runs PRODUCERS concurrent appenders, producer `p` on topic `p % TOPICS`,
//! until it is killed (or 200,000 appends each, a safety bound). After every
//! acknowledged append it prints one line to stdout, `TOPIC BASE COUNT
//! GENERATION PRODUCER SEQ`, and flushes it: the parent treats exactly the
//! printed lines as acknowledged.

use std::io::Write;
use std::sync::Arc;

use anyhow::{Context, bail};
use broker_core::wal::{SyncMode, Wal};
use tributary_proto::Codec;
use tributary_tests::crash::{crash_wal_config, records_for, topic_dir};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, generation, topics, producers, mode] = args.as_slice() else {
        bail!("usage: wal_crash_child DIR GENERATION TOPICS PRODUCERS SYNC_MODE");
    };
    let generation: u64 = generation.parse().context("GENERATION")?;
    let topics: u64 = topics.parse().context("TOPICS")?;
    let producers: u64 = producers.parse().context("PRODUCERS")?;
    let mode: SyncMode = mode.parse().map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let wals = (0..topics)
            .map(|t| {
                Ok(Arc::new(Wal::open(
                    topic_dir(dir, t),
                    crash_wal_config(mode),
                )?))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let stdout = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        let mut tasks = Vec::new();
        for producer in 0..producers {
            let topic = producer % topics;
            let wal = wals[topic as usize].clone();
            let stdout = stdout.clone();
            tasks.push(tokio::spawn(async move {
                for seq in 0..200_000u64 {
                    let records = records_for(generation, producer, seq);
                    let count = records.len();
                    let ack = wal.append(records, Codec::None).await?;
                    let mut out = stdout.lock().map_err(|_| anyhow::anyhow!("stdout lock"))?;
                    writeln!(
                        out,
                        "{topic} {} {count} {generation} {producer} {seq}",
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
