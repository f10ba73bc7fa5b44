"""Trust: identities, certificates and what each identity may do on the wire.

- `identity`: who a client is (`agent:NODE`, `fleet:PREFIX`, `user:NAME`, `coordinator`),
  its certificate's common name, its files in a certificate directory, its inbox prefix.
- `pki`: a CA and client/server certificates (`mesh certs`).
- `permissions`: the NATS publish/subscribe permissions of an identity, a pure function
  of the region and the identity.

See docs/security.md for the threat model.
"""
