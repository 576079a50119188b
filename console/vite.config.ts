import { defineConfig } from 'vite'
import preact from '@preact/preset-vite'

// The console is built into the Go package that embeds it; make build
// removes the previous build first (the directory keeps its README).
export default defineConfig({
  plugins: [preact()],
  build: {
    outDir: '../internal/console/dist',
    emptyOutDir: false,
    assetsInlineLimit: 0, // no data: URLs for assets: every file is served as itself
    modulePreload: { polyfill: false }, // no inline script
    chunkSizeWarningLimit: 2048,
  },
})
