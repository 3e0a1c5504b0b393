use std::io::Read;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use custody_proto::mover::stream;

use super::{TarInput, ToolExit, read_status, run_tool, setup, tool_exit, write_status};
use crate::manifest_builder::BuildError;

#[test]
fn only_a_tool_that_exited_0_wrote_a_backup() {
    let rows = [
        (0, ToolExit::Succeeded),
        (1, ToolExit::Failed(1)),
        (143, ToolExit::Failed(143)),
        (-1, ToolExit::Failed(-1)),
    ];
    for (code, expected) in rows {
        assert_eq!(tool_exit(code), expected, "{code}");
    }
}

fn input(dir: &std::path::Path) -> TarInput {
    TarInput {
        dir: dir.to_path_buf(),
        data_path: String::new(),
        fifo: None,
        _ended: None,
    }
}

/// The tool's wrapper waits for the mover's read end however late the mover comes, and ends
/// (exit code 1, written for the mover) when the mover ended before it opened the stream,
/// instead of waiting for a reader for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_waits_for_the_movers_read_end_and_not_after_the_mover_ended() {
    let command = vec![
        "sh".to_string(),
        "-c".to_string(),
        "echo streamed".to_string(),
    ];

    // The mover connects after the tool started waiting: the tool's output reaches it.
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path()).unwrap();
    let tool = tokio::spawn({
        let (dir, command) = (dir.path().to_path_buf(), command.clone());
        async move { run_tool(&dir, &command).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!tool.is_finished(), "the tool did not wait for the mover");
    let input = TarInput::connect(dir.path().to_path_buf(), String::new()).unwrap();
    let read = tokio::task::spawn_blocking({
        let input = input.clone();
        move || {
            let mut read = String::new();
            let stop = AtomicBool::new(false);
            input
                .open(&stop)
                .unwrap()
                .read_to_string(&mut read)
                .unwrap();
            read
        }
    })
    .await
    .unwrap();
    assert_eq!(read, "streamed\n");
    assert_eq!(tool.await.unwrap().unwrap(), 0);
    drop(input);
    assert!(dir.path().join(stream::MOVER_ENDED).exists());

    // The mover connected and ended (it failed) before the tool started: the tool ends.
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path()).unwrap();
    drop(TarInput::connect(dir.path().to_path_buf(), String::new()).unwrap());
    let ran = tokio::time::timeout(Duration::from_secs(10), run_tool(dir.path(), &command))
        .await
        .expect("the tool waited for a mover that had ended");
    assert_eq!(ran.unwrap(), 1);
    assert_eq!(read_status(dir.path()).unwrap(), Some(1));
}

/// Whatever was read, the tool's exit code decides; a failed read is said as the tool's
/// failure when the tool failed.
#[test]
fn the_outcome_of_a_stream_is_the_tools_exit_code() {
    let stop = AtomicBool::new(false);
    let read_failed = || -> Result<u8, BuildError> {
        Err(BuildError::Archive {
            path: "the stream".into(),
            source: std::io::Error::other("unexpected end of file"),
        })
    };
    let dir = tempfile::tempdir().unwrap();
    write_status(dir.path(), 0).unwrap();
    assert_eq!(input(dir.path()).outcome(Ok(7u8), &stop).unwrap(), 7);
    assert!(matches!(
        input(dir.path()).outcome(read_failed(), &stop),
        Err(BuildError::Archive { .. })
    ));
    write_status(dir.path(), 3).unwrap();
    let failed = input(dir.path()).outcome(Ok(7u8), &stop).unwrap_err();
    assert!(
        matches!(&failed, BuildError::ToolFailed(message) if message.contains("code 3")),
        "{failed}"
    );
    let failed = input(dir.path()).outcome(read_failed(), &stop).unwrap_err();
    assert!(
        matches!(&failed, BuildError::ToolFailed(message) if message.contains("code 3") && message.contains("unexpected end of file")),
        "{failed}"
    );
    // Stopped while the exit code is missing: the read's own error, else the tool's.
    let empty = tempfile::tempdir().unwrap();
    let stopped = AtomicBool::new(true);
    assert!(matches!(
        input(empty.path()).outcome(read_failed(), &stopped),
        Err(BuildError::Archive { .. })
    ));
    assert!(matches!(
        input(empty.path()).outcome(Ok(7u8), &stopped),
        Err(BuildError::ToolFailed(_))
    ));
}

/// Setup makes a FIFO anyone may write and a program anyone may run; a tool that exits
/// without writing is told apart by its exit code.
#[test]
fn a_tool_that_wrote_nothing_is_refused_by_its_exit_code() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path()).unwrap();
    let fifo = std::fs::metadata(dir.path().join("tar")).unwrap();
    assert!(fifo.file_type().is_fifo());
    assert_eq!(fifo.permissions().mode() & 0o777, 0o666);
    let program = std::fs::metadata(dir.path().join("custody-mover")).unwrap();
    assert_eq!(program.permissions().mode() & 0o777, 0o755);
    let stop = AtomicBool::new(false);
    for (code, said) in [(0, "wrote nothing"), (2, "code 2 before")] {
        write_status(dir.path(), code).unwrap();
        let refused = input(dir.path()).open(&stop).err().expect("refused");
        assert!(
            matches!(&refused, BuildError::ToolFailed(message) if message.contains(said)),
            "{code}: {refused}"
        );
    }
}

/// A failed read is the tool's when the stream broke, the mover's when it refused or could not
/// store what the stream held.
#[test]
fn a_broken_stream_is_the_tools_a_refusal_the_movers() {
    let io = || std::io::Error::other("x");
    let rows = [
        (
            BuildError::Read {
                path: "pgdata/base/1".into(),
                source: io(),
            },
            true,
        ),
        (
            BuildError::Changed {
                path: "p".into(),
                expected: 2,
                found: 1,
            },
            true,
        ),
        (
            BuildError::Archive {
                path: "the stream".into(),
                source: io(),
            },
            true,
        ),
        (BuildError::ToolFailed("t".into()), true),
        (
            BuildError::Archive {
                path: String::new(),
                source: io(),
            },
            false,
        ),
        (
            BuildError::Unsupported {
                path: "p".into(),
                kind: "hard link in a stream",
            },
            false,
        ),
        (
            BuildError::SymlinkLeavesVolume {
                path: "p".into(),
                target: "/x".into(),
            },
            false,
        ),
        (BuildError::Write(io()), false),
    ];
    for (error, broken) in rows {
        assert_eq!(super::broken_stream(&error), broken, "{error}");
    }
    // The tool failed (a broken pipe) after the mover refused a hard link: the refusal.
    let dir = tempfile::tempdir().unwrap();
    write_status(dir.path(), 141).unwrap();
    let refused: Result<u8, BuildError> = Err(BuildError::Unsupported {
        path: "p".into(),
        kind: "hard link in a stream",
    });
    assert!(matches!(
        input(dir.path()).outcome(refused, &AtomicBool::new(false)),
        Err(BuildError::Unsupported { .. })
    ));
}
