use clap::Parser;
use custody_agent::cli::AgentOptions;
use custody_kube::process::init_tracing;

fn main() -> anyhow::Result<()> {
    let options = AgentOptions::parse();
    init_tracing(options.log_format);
    // Two workers: the agent mostly waits; verification runs on the blocking pool and rayon.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(custody_agent::daemon::run(options))?;
    Ok(())
}
