//! `lightstore` — the LightStore command-line tool. Subcommands: `bench`
//! (the paper's workloads against the engine in-process). The node server,
//! cluster and adapter subcommands come with their issues.

use clap::{Parser, Subcommand};

mod bench;
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
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::run(args),
    };
    if let Err(e) = result {
        eprintln!("lightstore: {e}");
        std::process::exit(1);
    }
}
