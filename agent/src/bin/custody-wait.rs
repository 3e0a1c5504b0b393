use clap::Parser;
use custody_agent::cli::WaitOptions;

fn main() -> std::process::ExitCode {
    let options = WaitOptions::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("custody-wait: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        tokio::select! {
            released = custody_agent::wait::run(&options) => {
                println!(
                    "custody-wait: released {}: {} volume(s) verified; verified_at_unix_nanos={}",
                    released.pod,
                    released.volumes.len(),
                    released.verified_at_unix_nanos
                );
                std::process::ExitCode::SUCCESS
            }
            _ = custody_kube::process::wait_for_signal() => {
                println!("custody-wait: stopped before the pod's volumes were verified");
                std::process::ExitCode::from(143)
            }
        }
    })
}
