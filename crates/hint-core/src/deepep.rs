//! DeepEP-compatible buffer sizing (filled by the DeepEP issue).
