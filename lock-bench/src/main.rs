//! `lock-bench`: lock-core measured side by side with the floor (raw round
//! trips), a hand-written minimum lock, and rslock, in one run.
//!
//! ```text
//! cargo run --release -p lock-bench                       # everything, 5 s per row
//! cargo run --release -p lock-bench -- --only W1,W3 --seconds 2
//! cargo run --release -p lock-bench -- --only W1,W2 --transport plain,tls,cluster
//! ```
//!
//! It starts its own `redis-server` processes on free ports (through
//! `lock-testkit`; the binary comes from `REDIS_SERVER_BIN` or `PATH`), runs
//! the selected workloads one row at a time, prints one table to stdout
//! (progress goes to stderr), and writes the same data as CSV and JSON, with
//! a text copy of the table, into the output directory
//! (`target/lock-bench` by default). The servers are stopped when the run
//! ends, however it ends.
//!
//! Modules: [`args`] (options and flags), [`servers`] (the redis-server
//! processes and admin commands), [`minimum`] (the hand-written lock),
//! [`contenders`] (the implementations behind one interface), [`table`]
//! (workload ids, rows, row labels), [`workloads`] (W1-W11 and their loops;
//! W7 and W10 re-execute the bench as a holder or leader they kill),
//! [`transport`] (plain, TLS, cluster: what W1 and W2 talk over),
//! [`stats`] (percentiles, merged acquisition records, clocks), [`sysinfo`]
//! (`/proc`), [`report`] (table, CSV, JSON, ratios).
//!
//! rslock is a normal dependency, not behind a feature: its `tokio-comp`
//! feature turns on redis' rustls support (rustls, ring,
//! rustls-native-certs), which a workspace build compiles anyway for
//! lock-core's `tls` tests.

mod args;
mod contenders;
mod endpoint;
mod error;
mod minimum;
mod network;
mod report;
mod servers;
mod soak;
mod stats;
mod sysinfo;
mod table;
mod transport;
mod workloads;

use crate::args::{Command, Options, USAGE};
use crate::error::BenchResult;
use crate::network::Network;
use crate::report::Report;
use crate::servers::{Servers, connect, info};
use crate::sysinfo::Machine;
use crate::table::{WorkloadId, WorkloadResult};
use crate::transport::{Endpoint, Transport, TransportServers};
use crate::workloads::Context;
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let command = match args::parse(std::env::args().skip(1)) {
        Ok(command) => command,
        Err(e) => {
            eprintln!("lock-bench: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match command {
        Command::Help => {
            println!("{USAGE}");
            Ok(())
        }
        Command::Worker(worker) => workloads::w3p::worker(&worker),
        Command::Holder(holder) => workloads::w7::holder(&holder),
        Command::Leader(leader) => workloads::w10::leader(&leader),
        Command::Run(options) => run(&options),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lock-bench: {}", error::whole(&*e));
            ExitCode::FAILURE
        }
    }
}

/// A whole benchmark run. The servers live in this frame, so they are
/// stopped on every way out of it.
fn run(options: &Options) -> BenchResult<()> {
    if let Some(length) = options.soak {
        return run_soak(length);
    }
    // W4's and W5's servers serve plain TCP, the only transport they run on.
    let plain = options.transports.contains(&Transport::Plain) && options.rtt.is_none();
    let wants = |id| plain && options.only.contains(&id);
    eprintln!("lock-bench: starting redis-server processes");
    let servers = Servers::start(wants(WorkloadId::W4), wants(WorkloadId::W5))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(measure(options, &servers));
    // Stop lock-core's background tasks before the servers go.
    drop(runtime);
    drop(servers);
    let report = report?;

    let text = report.render();
    print!("{text}");
    std::fs::create_dir_all(&options.out)?;
    let files = [
        ("lock-bench.txt", text),
        ("lock-bench.csv", report.csv()),
        ("lock-bench.json", report.json()),
    ];
    for (name, content) in files {
        std::fs::write(options.out.join(name), content)?;
    }
    eprintln!(
        "lock-bench: wrote lock-bench.{{txt,csv,json}} to {}",
        options.out.display()
    );
    Ok(())
}

/// The leak soak on a server of its own; no table.
fn run_soak(length: Duration) -> BenchResult<()> {
    eprintln!("lock-bench: starting redis-server");
    let servers = Servers::start(false, false)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let soaked = runtime.block_on(soak::run(&servers.single.url(), length));
    drop(runtime);
    drop(servers);
    soaked
}

/// Describes the machine and runs every selected workload: W1 and W2 once
/// per transport, the others on plain TCP.
async fn measure(options: &Options, servers: &Servers) -> BenchResult<Report> {
    let url = servers.single.url();
    let mut machine = Machine::describe();
    let server_info = info(&mut connect(&url).await?, "server").await?;
    machine.redis_version = server_info
        .get("redis_version")
        .cloned()
        .unwrap_or_default();
    let ctx = Context {
        seconds: options.seconds,
        warmup: (options.seconds / 5).min(Duration::from_millis(500)),
        endpoint: Endpoint::Plain(vec![url.clone()]),
        url,
        transport: Transport::Plain,
        redlock_urls: servers.redlock_urls(),
        hold_url: servers.hold.as_ref().map(|s| s.url()),
        w5_seconds: options.w5_seconds,
        w5_locks: options.w5_locks,
        w5_ttl: options.w5_ttl,
        w5_wait: options.w5_wait,
        w5_capacity: options.w5_capacity,
        impls: options.impls.clone(),
        w7_rounds: options.w7_rounds,
        w10_resignations: options.w10_resignations,
        w10_crashes: options.w10_crashes,
        w11_cycles: options.w11_cycles,
        network: None,
    };
    let on_any_transport = |id: &WorkloadId| matches!(id, WorkloadId::W1 | WorkloadId::W2);
    // W5 also holds its locks on a cluster, and the plain row's on its own
    // server.
    let on_transport = |id: &WorkloadId, transport: Transport| {
        on_any_transport(id)
            || (*id == WorkloadId::W5 && transport == Transport::Cluster)
            || transport == Transport::Plain
    };
    let skipped: Vec<&str> = options
        .only
        .iter()
        .filter(|id| !on_any_transport(id))
        .map(|id| id.name())
        .collect();
    if skipped.is_empty() {
        // Nothing left out.
    } else if options.rtt.is_some() {
        eprintln!(
            "lock-bench: --rtt runs W1 and W2 only: {} skipped",
            skipped.join(", ")
        );
    } else if !options.transports.contains(&Transport::Plain) {
        let left_out: Vec<&str> = options
            .only
            .iter()
            .filter(|id| !options.transports.iter().any(|&t| on_transport(id, t)))
            .map(|id| id.name())
            .collect();
        if !left_out.is_empty() {
            eprintln!(
                "lock-bench: {} run on plain TCP only (W5 on a cluster too), which --transport \
                 left out: skipped",
                left_out.join(", ")
            );
        }
    }
    let mut results = Vec::new();
    let mut networks = Vec::new();
    for &transport in &options.transports {
        // Started one transport at a time, and stopped before the next, so
        // no idle server shares the machine with the measured one.
        let started = if transport == Transport::Plain {
            None
        } else {
            eprintln!("lock-bench: starting the {} servers", transport.name());
            tokio::task::block_in_place(|| TransportServers::start(transport))?
        };
        let mut ctx = Context {
            transport,
            endpoint: started
                .as_ref()
                .map_or_else(|| ctx.endpoint.clone(), TransportServers::endpoint),
            ..ctx.clone()
        };
        // With --rtt, W1 and W2 alone, through a proxy of this transport's own.
        let network = match options.rtt {
            Some(rtt) => Some(Network::start(rtt, transport, &ctx.endpoint).await?),
            None => None,
        };
        if let Some(network) = &network {
            ctx.endpoint = network.endpoint.clone();
            ctx.network = Some(network.note.describe());
            networks.push(network.note.clone());
        }
        for id in options.only.iter().filter(|id| {
            if network.is_some() {
                on_any_transport(id)
            } else {
                on_transport(id, transport)
            }
        }) {
            results.push(run_workload(*id, &ctx).await?);
        }
        tokio::task::block_in_place(|| drop((network, started)));
    }
    Ok(Report {
        machine,
        seconds: options.seconds.as_secs_f64(),
        workloads: results,
        networks,
    })
}

/// Runs the workload `id`.
async fn run_workload(id: WorkloadId, ctx: &Context) -> BenchResult<WorkloadResult> {
    match id {
        WorkloadId::W1 => workloads::w1::run(ctx).await,
        WorkloadId::W2 => workloads::w2::run(ctx).await,
        WorkloadId::W3 => workloads::w3::run(ctx).await,
        WorkloadId::W3p => workloads::w3p::run(ctx).await,
        WorkloadId::W4 => workloads::w4::run(ctx).await,
        WorkloadId::W5 => workloads::w5::run(ctx).await,
        WorkloadId::W6 => workloads::w6::run(ctx).await,
        WorkloadId::W7 => workloads::w7::run(ctx).await,
        WorkloadId::W8 => workloads::w8::run(ctx).await,
        WorkloadId::W9 => workloads::w9::run(ctx).await,
        WorkloadId::W10 => workloads::w10::run(ctx).await,
        WorkloadId::W11 => workloads::w11::run(ctx).await,
    }
}
