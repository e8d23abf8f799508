//! A small HTTP/1.1 server on 127.0.0.1 for the download tests: each path answers as a test
//! says (a file, a redirect, a body cut half-way), one request per connection.
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// How one path answers.
#[derive(Clone)]
pub enum Answer {
    /// 200 with these bytes and extra headers.
    File { body: Vec<u8>, headers: Vec<(String, String)> },
    /// 302 to `location`, with extra headers (the hub's X-Linked-Etag, X-Repo-Commit).
    Redirect { location: String, headers: Vec<(String, String)> },
    /// 200 announcing all of `body` but closing after its first half.
    CutHalfWay { body: Vec<u8> },
}

pub struct Server {
    pub port: u16,
    stop: Arc<AtomicBool>,
    /// "METHOD PATH" of every request, in order.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub fn start(routes: HashMap<String, Answer>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stop2, log2) = (stop.clone(), log.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(c) = conn {
                    let _ = answer(c, &routes, &log2);
                }
            }
        });
        Server { port, stop, log }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port)); // wakes the accept loop
    }
}

fn answer(c: TcpStream, routes: &HashMap<String, Answer>, log: &Mutex<Vec<String>>) -> std::io::Result<()> {
    let mut r = BufReader::new(c.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
    }
    log.lock().unwrap().push(format!("{method} {path}"));
    let head = method == "HEAD";
    let mut w = c;
    let extra = |hs: &[(String, String)]| hs.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect::<String>();
    match routes.get(&path) {
        None => write!(w, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?,
        Some(Answer::File { body, headers }) => {
            write!(
                w,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
                body.len(),
                extra(headers)
            )?;
            if !head {
                w.write_all(body)?;
            }
        }
        Some(Answer::Redirect { location, headers }) => write!(
            w,
            "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n{}Connection: close\r\n\r\n",
            extra(headers)
        )?,
        Some(Answer::CutHalfWay { body }) => {
            write!(w, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())?;
            if !head {
                w.write_all(&body[..body.len() / 2])?;
            }
        }
    }
    w.flush()?;
    w.shutdown(std::net::Shutdown::Both)
}
