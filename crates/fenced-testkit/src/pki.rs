//! Certificates made by `fenced certs` in one directory: a CA, nodes by id,
//! servers and clients by name; each made on first use.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{ensure, Context, Result};
use fenced_client::TlsOptions;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

#[derive(Debug, Clone)]
pub struct Pki {
    pub dir: PathBuf,
    /// The `fenced` binary that makes them.
    bin: PathBuf,
}

impl Pki {
    /// A new CA in `dir`, made by `bin certs ca` (an existing one is kept).
    pub fn new(bin: &Path, dir: &Path) -> Result<Pki> {
        let pki = Pki {
            dir: dir.to_path_buf(),
            bin: bin.to_path_buf(),
        };
        if !pki.ca().exists() {
            pki.certs(&["ca"])?;
        }
        Ok(pki)
    }

    /// Runs `fenced certs ARGS --dir DIR`.
    pub fn certs(&self, args: &[&str]) -> Result<()> {
        let out = Command::new(&self.bin)
            .arg("certs")
            .args(args)
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .with_context(|| format!("running {} certs {args:?}", self.bin.display()))?;
        ensure!(
            out.status.success(),
            "{} certs {args:?} failed: {}",
            self.bin.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    fn pair(&self, stem: &str, make: &[&str]) -> Result<(PathBuf, PathBuf)> {
        let cert = self.dir.join(format!("{stem}.pem"));
        if !cert.exists() {
            self.certs(make)?;
        }
        Ok((cert, self.dir.join(format!("{stem}-key.pem"))))
    }

    /// Node `id`'s certificate and key, naming `host` (made on first use).
    pub fn node(&self, id: u64, host: &str) -> Result<(PathBuf, PathBuf)> {
        let id = id.to_string();
        self.pair(
            &format!("node-{id}"),
            &["node", "--id", &id, "--host", host],
        )
    }

    /// Service `name`'s server certificate and key for `host`.
    pub fn server(&self, name: &str, host: &str) -> Result<(PathBuf, PathBuf)> {
        self.pair(
            &format!("server-{name}"),
            &["server", "--name", name, "--host", host],
        )
    }

    /// Client `name`'s certificate and key.
    pub fn client(&self, name: &str) -> Result<(PathBuf, PathBuf)> {
        self.pair(&format!("client-{name}"), &["client", "--name", name])
    }

    /// Client options trusting this CA, with client `name`'s certificate
    /// when given.
    pub fn client_options(&self, name: Option<&str>) -> Result<TlsOptions> {
        let options = TlsOptions::new().ca(self.ca());
        Ok(match name {
            Some(n) => {
                let (cert, key) = self.client(n)?;
                options.identity(cert, key)
            }
            None => options,
        })
    }

    /// What a TLS connection trusts and, with `name`, shows.
    pub fn tls_config(&self, name: Option<&str>) -> Result<ClientTlsConfig> {
        let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        let mut tls =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&self.ca())?));
        if let Some(name) = name {
            let (cert, key) = self.client(name)?;
            tls = tls.identity(Identity::from_pem(read(&cert)?, read(&key)?));
        }
        Ok(tls)
    }

    /// A lazily connecting gRPC channel to `addr` trusting this CA, showing
    /// client `name`'s certificate when given.
    pub fn channel(&self, addr: &str, name: Option<&str>) -> Result<Channel> {
        Ok(Channel::from_shared(format!("https://{addr}"))
            .context("endpoint")?
            .tls_config(self.tls_config(name)?)
            .context("TLS configuration")?
            .timeout(Duration::from_secs(5))
            .connect_lazy())
    }
}
