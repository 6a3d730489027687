//! A loopback TCP forwarder that stands in for a virtual IP in front of a
//! database: one address whose target moves. Moving it cuts the
//! connections to the old target, as the real move does (the old host is
//! gone). Dropping it stops everything it started.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub struct Vip {
    pub port: u16,
    target: Arc<AtomicU16>,
    stop: Arc<AtomicBool>,
    /// Both ends of every connection forwarded, to cut them on a move.
    open: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl Vip {
    pub fn start(target: u16) -> Vip {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().unwrap().port();
        let target = Arc::new(AtomicU16::new(target));
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let (target, stop, open) = (target.clone(), stop.clone(), open.clone());
            std::thread::spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    let to = SocketAddr::from(([127, 0, 0, 1], target.load(Ordering::Relaxed)));
                    let Ok(server) = TcpStream::connect_timeout(&to, Duration::from_secs(2)) else {
                        // a refused connection: the client sees it closed
                        continue;
                    };
                    if let Err(e) = relay(client, server, &open) {
                        eprintln!("vip: {e}");
                    }
                }
            })
        };
        Vip {
            port,
            target,
            stop,
            open,
            accept: Some(accept),
        }
    }

    /// Moves the address to `port`, cutting every connection made so far.
    pub fn point_to(&self, port: u16) {
        self.target.store(port, Ordering::Relaxed);
        self.cut_all();
    }

    fn cut_all(&self) {
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Copies both ways on two threads; each end is kept (a clone) for a cut.
fn relay(client: TcpStream, server: TcpStream, open: &Mutex<Vec<TcpStream>>) -> io::Result<()> {
    {
        let mut open = open.lock().unwrap();
        open.push(client.try_clone()?);
        open.push(server.try_clone()?);
    }
    for (mut from, mut to) in [(client.try_clone()?, server.try_clone()?), (server, client)] {
        std::thread::spawn(move || {
            let _ = io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
        });
    }
    Ok(())
}

impl Drop for Vip {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // wake the accept loop
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.cut_all();
    }
}
