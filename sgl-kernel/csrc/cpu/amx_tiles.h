// The AMX tile configuration shared by the amx set's tile kernels (panels_amx_impl.h,
// attention_amx_impl.h); included by isa_amx.cpp inside its namespace, before both.

struct alignas(64) AmxTileConfig {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Tiles 0-5 of `rows` rows (A and C), tiles 6-7 of 16 (B: 16 pair rows); every tile 64 bytes wide.
inline void amx_configure(int rows) {
    AmxTileConfig c;
    for (int t = 0; t < 8; ++t) {
        c.rows[t] = t >= 6 ? 16 : rows;
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
}
