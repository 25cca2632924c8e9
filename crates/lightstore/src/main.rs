//! `lightstore` — the LightStore command-line tool. Subcommands: `node`
//! (the node server: one device served over RESP) and `bench` (the paper's
//! workloads against the engine in-process). Cluster and adapter
//! subcommands come with their issues.

use std::io::IsTerminal;

use clap::{Parser, Subcommand};

mod bench;
mod node;
mod workload;

#[derive(Parser)]
#[command(
    name = "lightstore",
    version,
    about = "LightStore: a network-attached key-value drive"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node: own one device and serve it over RESP (redis-cli works).
    Node(node::NodeArgs),
    /// Run a key-value workload against the engine in-process.
    Bench(bench::BenchArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Node(args) => node::run(args),
        Command::Bench(args) => bench::run(args).map_err(Into::into),
    };
    if let Err(e) = result {
        eprintln!("lightstore: {e}");
        std::process::exit(1);
    }
}
