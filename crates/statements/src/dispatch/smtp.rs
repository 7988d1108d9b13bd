//! A minimal SMTP client that knows how far a send got.
//!
//! Written by hand because what matters here is the phase at which a send
//! fails, which the SMTP crates do not expose: before the end of `DATA`
//! nothing can have been delivered, so the send may be retried; after the
//! final `.` is written and before the server's reply, the message may or
//! may not have been taken, and a receiver that can neither deduplicate nor
//! be asked makes that an operator's decision. Plain SMTP on loopback or a
//! trusted network (no STARTTLS, no AUTH): put a local relay in front of a
//! remote provider.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::Sent;

/// An email to send.
pub struct Mail<'a> {
    pub from: &'a str,
    pub to: &'a str,
    pub subject: &'a str,
    pub body: &'a str,
    /// The outbox operation id: the Message-ID, so a person can see duplicates.
    pub operation: &'a str,
}

fn header_safe(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).collect()
}

/// The message, dot-stuffed, with CRLF line ends and the terminating dot.
fn render(mail: &Mail<'_>) -> Vec<u8> {
    let id: String = mail
        .operation
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-._".contains(c) {
                c
            } else {
                '.'
            }
        })
        .collect();
    let mut text = format!(
        "From: <{}>\r\nTo: <{}>\r\nSubject: {}\r\nMessage-ID: <{id}@statements.baton>\r\nX-Baton-Operation: {}\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n",
        header_safe(mail.from),
        header_safe(mail.to),
        header_safe(mail.subject),
        header_safe(mail.operation),
    );
    for line in mail.body.lines() {
        if line.starts_with('.') {
            text.push('.');
        }
        text.push_str(line);
        text.push_str("\r\n");
    }
    text.push_str(".\r\n");
    text.into_bytes()
}

struct Conn {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
    timeout: Duration,
}

impl Conn {
    /// One reply, multi-line replies joined: (code, text).
    async fn reply(&mut self) -> std::io::Result<(u16, String)> {
        let mut text = String::new();
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(self.timeout, self.reader.read_line(&mut line))
                .await
                .map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply in time")
                })??;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
            let line = line.trim_end();
            let code = line
                .get(..3)
                .and_then(|c| c.parse::<u16>().ok())
                .ok_or_else(|| std::io::Error::other(format!("not an SMTP reply: {line:?}")))?;
            text.push_str(line);
            if line.as_bytes().get(3) != Some(&b'-') {
                return Ok((code, text));
            }
            text.push(' ');
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        tokio::time::timeout(self.timeout, self.writer.write_all(bytes))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "write timed out"))?
    }

    /// A command before the end of DATA: any failure means nothing was sent.
    async fn command(&mut self, line: &str, want: &[u16]) -> Result<(), Sent> {
        self.send(format!("{line}\r\n").as_bytes())
            .await
            .map_err(|e| Sent::NeverArrived(format!("{line}: {e}")))?;
        let (code, text) = self
            .reply()
            .await
            .map_err(|e| Sent::NeverArrived(format!("{line}: {e}")))?;
        expect(code, &text, want)
    }
}

/// A reply before the end of DATA: 4xx is worth another try, 5xx is final.
fn expect(code: u16, text: &str, want: &[u16]) -> Result<(), Sent> {
    if want.contains(&code) {
        Ok(())
    } else if (500..600).contains(&code) {
        Err(Sent::Refused(text.to_string()))
    } else {
        Err(Sent::NeverArrived(text.to_string()))
    }
}

/// Sends one email to the relay at `addr`.
pub async fn send(addr: &str, mail: &Mail<'_>, timeout: Duration) -> Sent {
    match send_inner(addr, mail, timeout).await {
        Ok(sent) | Err(sent) => sent,
    }
}

async fn send_inner(addr: &str, mail: &Mail<'_>, timeout: Duration) -> Result<Sent, Sent> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| Sent::NeverArrived(format!("connecting to {addr}: timed out")))?
        .map_err(|e| Sent::NeverArrived(format!("connecting to {addr}: {e}")))?;
    let (r, w) = stream.into_split();
    let mut c = Conn {
        reader: BufReader::new(r),
        writer: w,
        timeout,
    };
    let (code, text) = c
        .reply()
        .await
        .map_err(|e| Sent::NeverArrived(format!("greeting: {e}")))?;
    expect(code, &text, &[220])?;
    c.command("EHLO statements.baton", &[250]).await?;
    c.command(&format!("MAIL FROM:<{}>", header_safe(mail.from)), &[250])
        .await?;
    c.command(&format!("RCPT TO:<{}>", header_safe(mail.to)), &[250, 251])
        .await?;
    c.command("DATA", &[354]).await?;
    // A write that fails never handed the terminating dot to the kernel,
    // so the server cannot have taken the message; once it is written,
    // only the server's reply says.
    let message = render(mail);
    if let Err(e) = c.send(&message).await {
        return Ok(Sent::NeverArrived(format!("writing the message: {e}")));
    }
    let sent = match c.reply().await {
        Ok((250, text)) => Sent::Delivered(text),
        Ok((code, text)) if (400..500).contains(&code) => Sent::NeverArrived(text),
        Ok((_, text)) => Sent::Refused(text),
        Err(e) => Sent::Unknown(format!("after the end of DATA: {e}")),
    };
    let _ = c.send(b"QUIT\r\n").await;
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_dot_stuffed_and_headers_cannot_be_injected() {
        let mail = Mail {
            from: "a@x",
            to: "b@y\r\nBcc: evil@z",
            subject: "hi",
            body: ".hidden\nplain",
            operation: "publish:acct:2026-09-13:t7/email",
        };
        let text = String::from_utf8(render(&mail)).unwrap();
        assert!(text.contains("\r\n..hidden\r\nplain\r\n.\r\n"), "{text}");
        assert!(text.contains("To: <b@yBcc: evil@z>"), "{text}");
        assert!(text.contains("Message-ID: <publish.acct.2026-09-13.t7.email@statements.baton>"));
    }
}
