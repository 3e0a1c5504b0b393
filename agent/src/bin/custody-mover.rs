use clap::Parser;
use custody_agent::cli::MoverOptions;
use custody_agent::mover;

fn main() -> std::process::ExitCode {
    let options = MoverOptions::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("custody-mover: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = custody_agent::mover::cli::run(&options) => outcome,
            _ = custody_controller::run::wait_for_signal() => Err(("Interrupted", "stopped by a signal".to_string())),
        }
    });
    match outcome {
        Ok(json) => {
            println!("{json}");
            mover::write_result(options.result_file.as_ref(), &json);
            std::process::ExitCode::SUCCESS
        }
        Err((reason, message)) => {
            let json =
                serde_json::json!({"error": {"reason": reason, "message": message}}).to_string();
            eprintln!("custody-mover: {reason}: {message}");
            mover::write_result(options.result_file.as_ref(), &json);
            std::process::ExitCode::FAILURE
        }
    }
}
