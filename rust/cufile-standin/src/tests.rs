//! Tests of the exports called directly (nothing loaded): host memory and real temporary files.
