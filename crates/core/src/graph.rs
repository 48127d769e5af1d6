//! Rendering a machine as a Mermaid or Graphviz DOT diagram.
