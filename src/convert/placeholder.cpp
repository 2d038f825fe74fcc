// placeholder: replaced by the real sources of this layer
