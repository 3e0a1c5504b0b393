//! `kubectl custody`: see [`custody_kubectl`].

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = <custody_kubectl::Cli as clap::Parser>::parse();
    match custody_kubectl::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
