//! The watchdog hears from the loop that would stop if the daemon hung: while the
//! reclaimer's loop is held (a failpoint, as a deadlock would hold it) no WATCHDOG=1
//! reaches systemd, so systemd would restart the daemon; released, the pings resume.
//! In-process (for the failpoint), so this file holds one test: it sets the
//! process's NOTIFY_SOCKET and WATCHDOG_USEC.

mod common;

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use mailstream::RunOptions;
use mailstream::model::outcome::Failpoint;
use mailstream::tools::emulator::EmulatorConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_reclaimer_loop_stops_the_watchdog_pings() {
    let dir = std::env::temp_dir().join(format!("mailstream-watchdog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&path);
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    // SAFETY: this test binary runs this one test, and nothing else reads or
    // writes the environment while it is set.
    unsafe {
        std::env::set_var("NOTIFY_SOCKET", &path);
        std::env::set_var("WATCHDOG_USEC", "2000000");
        std::env::remove_var("WATCHDOG_PID");
    }
    let pings = Arc::new(Mutex::new(0u64));
    let counter = pings.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1024];
        loop {
            match socket.recv(&mut buf) {
                Ok(n) if String::from_utf8_lossy(&buf[..n]).lines().any(|l| l == "WATCHDOG=1") => {
                    *counter.lock().unwrap() += 1
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return,
            }
        }
    });
    let count = || *pings.lock().unwrap();

    let mut world = World::new().await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let (hang, held) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (h, d) = (hang.clone(), held.clone());
    let failpoints = mailstream::Failpoints::new(move |at| -> mailstream::Hold {
        let (hang, held) = (h.clone(), d.clone());
        Box::pin(async move {
            if at == Failpoint::ReclaimTick {
                while hang.load(Ordering::SeqCst) {
                    held.store(true, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                held.store(false, Ordering::SeqCst);
            }
        })
    });
    let daemon = Daemon::start(world.config.clone(), RunOptions { failpoints, ..Default::default() });
    let pinging = eventually(Duration::from_secs(30), || async { (count() >= 3).then_some(()) }).await;
    assert!(pinging.is_some(), "the loop pings while it turns");

    hang.store(true, Ordering::SeqCst);
    let holding = eventually(Duration::from_secs(30), || async { held.load(Ordering::SeqCst).then_some(()) }).await;
    assert!(holding.is_some());
    // A ping sent before the hold is already in the socket; let the reader take it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = count();
    // The loop turns every 100 ms here: twenty turns' worth of silence.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(count(), before, "no WATCHDOG=1 while the loop is held");
    assert!(held.load(Ordering::SeqCst));

    hang.store(false, Ordering::SeqCst);
    let resumed = eventually(Duration::from_secs(30), || async { (count() >= before + 2).then_some(()) }).await;
    daemon.stop().await;
    assert!(resumed.is_some(), "pings resume once the loop turns again");
}
